#pragma once
#include <string>

namespace mt {

// Memory layout of image activations. NHWC is what the data files hold and what tensor cores
// prefer; NCHW is PyTorch's default. Convolution weights follow the layout: [O,C,KH,KW] for NCHW,
// [O,KH,KW,C] for NHWC (cuDNN's KCRS / KRSC filter formats).
enum class Layout { kNCHW, kNHWC };

inline const char* layoutName(Layout l) { return l == Layout::kNCHW ? "nchw" : "nhwc"; }
inline bool parseLayout(const std::string& s, Layout* out) {
  if (s == "nchw") *out = Layout::kNCHW;
  else if (s == "nhwc") *out = Layout::kNHWC;
  else return false;
  return true;
}

}  // namespace mt
