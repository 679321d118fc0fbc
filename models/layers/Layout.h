#pragma once
#include <string>

#include "core/EnumTable.h"

namespace mt {

// Memory layout of image activations. NHWC is what the data files hold and what tensor cores
// prefer; NCHW is PyTorch's default. Convolution weights follow the layout: [O,C,KH,KW] for NCHW,
// [O,KH,KW,C] for NHWC (cuDNN's KCRS / KRSC filter formats).
enum class Layout { kNCHW, kNHWC };

inline const EnumTable<Layout>& layouts() {
  static const EnumTable<Layout> kTable = {{Layout::kNHWC, "nhwc"}, {Layout::kNCHW, "nchw"}};
  return kTable;
}
inline const char* layoutName(Layout l) { return enumName(layouts(), l); }
inline bool parseLayout(const std::string& s, Layout* out) { return parseEnum(layouts(), s, out); }

}  // namespace mt
