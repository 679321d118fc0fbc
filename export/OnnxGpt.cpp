// GPT-2 (models/gpt/Gpt.h) as an ONNX graph with a dynamic batch and sequence length:
//   x0 = wte[tokens] + wpe[0:T]
//   block l:  x1 = x + proj(attn(qkv(ln1(x)))),   x' = x1 + fc2(gelu_tanh(fc1(ln2(x1))))
//   attn: per head S = q k^T / sqrt(d), S[t, s] = lowest float for s > t, P = softmax_s(S), y = P v
//   logits = lnf(x_L) · wte[:vocab]^T
// The causal mask and the positions come from one Range(0, T) so every shape follows the input.

#include <cmath>
#include <limits>

#include "export/OnnxLayers.h"

namespace mt {

namespace {

struct GptShape {
  int64_t layers, heads, channels, vocab, paddedVocab, maxT;
  float eps;
};

GptShape readShape(OnnxWriter& w, const nlohmann::json& arch) {
  GptShape s;
  s.layers = w.integer(arch, "n_layer", 1);
  s.heads = w.integer(arch, "n_head", 1);
  s.channels = w.integer(arch, "n_embd", 1);
  s.vocab = w.integer(arch, "vocab_size", 1);
  s.paddedVocab = w.integer(arch, "padded_vocab_size", s.vocab);
  s.maxT = w.integer(arch, "block_size", 1);
  s.eps = static_cast<float>(w.number(arch, "layernorm_eps"));
  if (s.channels % s.heads != 0)
    w.fail("n_embd " + std::to_string(s.channels) + " is not a multiple of n_head");
  if (w.word(arch, "gelu") != "tanh") w.fail("gpt gelu '" + w.word(arch, "gelu") + "' (the model uses tanh)");
  if (!arch.value("tied_embeddings", false)) w.fail("gpt without tied embeddings is not a meshtrain model");
  return s;
}

// The causal attention of one block on qkv [B, T, 3C]; keep [T, T] is true where s <= t.
std::string attention(OnnxWriter& w, const GptShape& s, const std::string& qkv, const std::string& keep,
                      const std::string& lowest, const std::string& site) {
  OnnxGraph& g = w.g;
  const int64_t d = s.channels / s.heads;
  // [B, T, 3C] -> [B, T, 3, H, d] -> [3, B, H, T, d]: the trainer's q, k, v order and head split.
  const std::string split = g.add(
      "Reshape", {qkv, g.addVectorI64(site + "/qkv_shape", {0, 0, 3, s.heads, d})}, site + "/split_heads");
  const std::string heads =
      g.add("Transpose", {split}, site + "/heads", {OnnxAttr::integers("perm", {2, 0, 3, 1, 4})});
  std::string part[3];
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i)
    part[i] = g.add("Gather", {heads, g.addScalarI64(site + "/" + names[i] + "_index", i)},
                    site + "/" + names[i], {OnnxAttr::integer("axis", 0)});
  const std::string kt =
      g.add("Transpose", {part[1]}, site + "/kT", {OnnxAttr::integers("perm", {0, 1, 3, 2})});
  // Attention.cpp: S = scale · (q k^T) with scale = 1 / sqrt(float(d)).
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  std::string scores = g.add("MatMul", {part[0], kt}, site + "/qk");
  scores = g.add("Mul", {scores, w.scalar(scale, site + "/scale")}, site + "/scaled");
  scores = g.add("Where", {keep, scores, lowest}, site + "/causal");
  const std::string probs = g.add("Softmax", {scores}, site + "/softmax", {OnnxAttr::integer("axis", -1)});
  const std::string y = g.add("MatMul", {probs, part[2]}, site + "/pv");
  const std::string merged =
      g.add("Transpose", {y}, site + "/merge", {OnnxAttr::integers("perm", {0, 2, 1, 3})});
  return g.add("Reshape", {merged, g.addVectorI64(site + "/out_shape", {0, 0, s.channels})}, site + "/y");
}

std::string block(OnnxWriter& w, const GptShape& s, int64_t l, const std::string& x, const std::string& keep,
                  const std::string& lowest) {
  OnnxGraph& g = w.g;
  const std::string p = "h" + std::to_string(l) + ".";
  const int64_t C = s.channels;
  w.param(p + "attn.c_attn.weight", {3 * C, C});
  w.param(p + "attn.c_proj.weight", {C, C});
  w.param(p + "mlp.c_fc.weight", {4 * C, C});
  w.param(p + "mlp.c_proj.weight", {C, 4 * C});
  const std::string h1 = w.layerNorm(x, p + "ln_1.", C, s.eps, p + "ln_1");
  const std::string qkv = w.linear(h1, p + "attn.c_attn.weight", p + "attn.c_attn.bias", p + "attn.c_attn");
  const std::string y = attention(w, s, qkv, keep, lowest, p + "attn");
  const std::string proj = w.linear(y, p + "attn.c_proj.weight", p + "attn.c_proj.bias", p + "attn.c_proj");
  const std::string x1 = g.add("Add", {proj, x}, p + "residual1");
  const std::string h2 = w.layerNorm(x1, p + "ln_2.", C, s.eps, p + "ln_2");
  const std::string fc = w.linear(h2, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias", p + "mlp.c_fc");
  const std::string act = w.gelu(fc, /*tanh=*/true, p + "mlp.gelu");
  const std::string out = w.linear(act, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias", p + "mlp.c_proj");
  return g.add("Add", {out, x1}, p + "residual2");
}

}  // namespace

void addGptGraph(OnnxWriter& w, const nlohmann::json& arch) {
  OnnxGraph& g = w.g;
  const GptShape s = readShape(w, arch);
  const int64_t C = s.channels;
  g.addInput("tokens", OnnxType::kInt64, {std::string("batch"), std::string("sequence")},
             "token ids int64 [batch, sequence], 0 <= id < vocab_size, sequence <= block_size (" +
                 std::to_string(s.maxT) + ")");
  const std::string wte = g.addInitializer("wte", w.param("wte", {s.paddedVocab, C}));
  const std::string wpe = g.addInitializer("wpe", w.param("wpe", {s.maxT, C}));

  // T as a scalar, positions 0..T-1, and the causal mask keep[t, s] = s <= t, all from the input.
  const std::string T1 =
      g.add("Shape", {"tokens"}, "seq_len_1d", {OnnxAttr::integer("start", 1), OnnxAttr::integer("end", 2)});
  const std::string T = g.add("Squeeze", {T1, g.addVectorI64("squeeze_axes", {0})}, "seq_len");
  const std::string pos =
      g.add("Range", {g.addScalarI64("range_start", 0), T, g.addScalarI64("range_step", 1)}, "positions");
  const std::string rows =
      g.add("Unsqueeze", {pos, g.addVectorI64("rows_axes", {1})}, "mask_rows");  // t, [T, 1]
  const std::string cols =
      g.add("Unsqueeze", {pos, g.addVectorI64("cols_axes", {0})}, "mask_cols");  // s, [1, T]
  const std::string keep = g.add("LessOrEqual", {cols, rows}, "causal_mask");
  const std::string lowest = w.scalar(std::numeric_limits<float>::lowest(), "masked_score");

  const std::string tok = g.add("Gather", {wte, "tokens"}, "wte_lookup", {OnnxAttr::integer("axis", 0)});
  const std::string posEmb = g.add("Gather", {wpe, pos}, "wpe_lookup", {OnnxAttr::integer("axis", 0)});
  std::string x = g.add("Add", {tok, posEmb}, "embeddings");
  for (int64_t l = 0; l < s.layers; ++l)
    x = block(w, s, l, x, keep, lowest);
  const std::string xf = w.layerNorm(x, "ln_f.", C, s.eps, "ln_f");

  // The tied classifier reads the same wte initializer: its first vocab_size rows, transposed.
  const std::string rowsV = g.add("Slice",
                                  {wte, g.addVectorI64("vocab_start", {0}),
                                   g.addVectorI64("vocab_end", {s.vocab}), g.addVectorI64("vocab_axes", {0})},
                                  "wte_vocab");
  const std::string wteT = g.add("Transpose", {rowsV}, "wte_T", {OnnxAttr::integers("perm", {1, 0})});
  g.addAs("MatMul", {w.hooks.activation(g, xf, "lm_head"), wteT}, "logits");
  g.addOutput("logits", OnnxType::kFloat, {std::string("batch"), std::string("sequence"), s.vocab},
              "next-token scores float [batch, sequence, vocab_size] (the padded vocabulary rows excluded)");
  g.setDoc("meshtrain gpt (" + std::to_string(s.layers) + " blocks, " + std::to_string(s.heads) + " heads, " +
           std::to_string(C) + " channels): tokens int64 [batch, sequence <= " + std::to_string(s.maxT) +
           "] -> logits float [batch, sequence, " + std::to_string(s.vocab) + "]");
}

}  // namespace mt
