#include "models/ModelConfig.h"

#include "models/layers/Activation.h"
#include "models/layers/Conv2d.h"
#include "models/layers/Dropout.h"
#include "models/layers/ImageInput.h"
#include "models/layers/Linear.h"
#include "models/layers/MaxPool2d.h"

namespace mt {

std::unique_ptr<Sequential> buildMlp(const ModelConfig& cfg, const InputSpec& in) {
  auto m = std::make_unique<Sequential>("mlp");
  m->add(std::make_unique<ImageInput>(ImageOutput::kFlat, cfg.inputMean, cfg.inputStd), "input");
  int64_t width = in.height * in.width * in.channels;
  int dropoutId = 0;
  for (size_t i = 0; i < cfg.hidden.size(); ++i) {
    const std::string idx = std::to_string(i + 1);
    m->add(std::make_unique<Linear>(width, cfg.hidden[i]), "fc" + idx);
    if (cfg.activation == "gelu") m->add(std::make_unique<GELU>(GeluKind::kTanh), "act" + idx);
    else m->add(std::make_unique<ReLU>(), "act" + idx);
    if (cfg.dropout > 0.f) m->add(std::make_unique<Dropout>(cfg.dropout, dropoutId++), "drop" + idx);
    width = cfg.hidden[i];
  }
  m->add(std::make_unique<Linear>(width, in.numClasses), "fc" + std::to_string(cfg.hidden.size() + 1));
  return m;
}

std::unique_ptr<Sequential> buildCnn(const ModelConfig& cfg, const InputSpec& in) {
  auto m = std::make_unique<Sequential>("cnn");
  const Layout L = cfg.layout;
  m->add(std::make_unique<ImageInput>(L == Layout::kNCHW ? ImageOutput::kNCHW : ImageOutput::kNHWC, cfg.inputMean,
                                      cfg.inputStd),
         "input");
  int64_t c = in.channels, h = in.height, w = in.width;
  for (size_t i = 0; i < cfg.convChannels.size(); ++i) {
    const std::string idx = std::to_string(i + 1);
    auto conv = std::make_unique<Conv2d>(L, c, cfg.convChannels[i], cfg.kernel, 1, cfg.kernel / 2);
    conv->fuseRelu();  // the ReLU after it runs inside the convolution
    m->add(std::move(conv), "conv" + idx);
    m->add(std::make_unique<ReLU>(/*inputRectified=*/true), "relu" + idx);
    m->add(std::make_unique<MaxPool2d>(L, 2), "pool" + idx);
    c = cfg.convChannels[i];
    h = (h + 2 * (cfg.kernel / 2) - cfg.kernel + 1) / 2;
    w = (w + 2 * (cfg.kernel / 2) - cfg.kernel + 1) / 2;
  }
  m->add(std::make_unique<Flatten>(), "flatten");
  m->add(std::make_unique<Linear>(c * h * w, cfg.fc), "fc1");
  m->add(std::make_unique<ReLU>(), "relu_fc");
  if (cfg.dropout > 0.f) m->add(std::make_unique<Dropout>(cfg.dropout, 0), "drop");
  m->add(std::make_unique<Linear>(cfg.fc, in.numClasses), "fc2");
  return m;
}

std::unique_ptr<Model> buildImageModel(const ModelConfig& cfg, const InputSpec& in) {
  if (cfg.type == "mlp") return buildMlp(cfg, in);
  if (cfg.type == "cnn") return buildCnn(cfg, in);
  throw ConfigError("model.type: unknown model '" + cfg.type + "' for image data (expected mlp or cnn)");
}

}  // namespace mt
