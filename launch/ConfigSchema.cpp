// Every configuration key, once: its default, kind, accepted range or names, and help text. Config
// validates against it, Settings reads typed values it has checked, and `trainer --help` and the
// README's configuration reference (`trainer --config-reference`) are generated from it. Choice keys
// backed by an enum take their names (and meanings) from that enum's table.

#include "comm/Compression.h"
#include "core/Log.h"
#include "data/DeviceFeed.h"
#include "data/H5File.h"
#include "launch/Config.h"
#include "models/gpt/Gpt.h"
#include "models/layers/Layout.h"
#include "sharding/ShardedEngine.h"

namespace mt {

namespace {

KeyRange positive() {
  KeyRange r;
  r.lo = 0, r.loOpen = true;
  return r;
}
KeyRange atLeast(double lo) {
  KeyRange r;
  r.lo = lo;
  return r;
}
KeyRange within(double lo, double hi, bool loOpen, bool hiOpen) {
  KeyRange r;
  r.lo = lo, r.hi = hi, r.loOpen = loOpen, r.hiOpen = hiOpen;
  return r;
}
const KeyRange kNonNegative = atLeast(0), kPositive = positive(), kFraction = within(0, 1, false, true);
// Model sizes: bounds far above any model trained today (GPT-3 175B: 96 x 12288, 96 heads) that
// keep every product of them (a [4C, C] matrix, V x C, layers x 12 C^2) inside int64 and the
// parameter table's build short, so a typo is a message naming the key, not an overflow or a
// setup that never ends.
constexpr double kMaxWidth = 1 << 24, kMaxVocab = 2147483647.0;  // token ids are int32

ConfigKey text(std::string key, std::string def, std::string help) {
  return {std::move(key), std::move(def), KeyKind::kString, std::move(help), {}, {}};
}
ConfigKey integer(std::string key, std::string def, KeyRange range, std::string help) {
  return {std::move(key), std::move(def), KeyKind::kInt, std::move(help), range, {}};
}
ConfigKey real(std::string key, std::string def, KeyRange range, std::string help) {
  return {std::move(key), std::move(def), KeyKind::kFloat, std::move(help), range, {}};
}
ConfigKey boolean(std::string key, std::string def, std::string help) {
  return {std::move(key), std::move(def), KeyKind::kBool, std::move(help), {}, {}};
}
ConfigKey intList(std::string key, std::string def, std::string help) {
  return {std::move(key), std::move(def), KeyKind::kIntList, std::move(help), {}, {}};
}
ConfigKey choice(std::string key, std::string def, std::vector<KeyChoice> choices, std::string help = "") {
  return {std::move(key), std::move(def), KeyKind::kChoice, std::move(help), {}, std::move(choices)};
}
// The names of an enum's table (its meanings too): the one list a choice key accepts.
template <typename E>
std::vector<KeyChoice> choicesOf(const EnumTable<E>& table) {
  std::vector<KeyChoice> out;
  for (const auto& e : table)
    if (e.selectable) out.push_back({e.name, e.meaning});
  return out;
}

}  // namespace

const std::vector<ConfigKey>& configSchema() {
  static const std::vector<ConfigKey> kSchema = {
      // run
      text("run.name", "fashion_mlp", "run name, a plain name (no '/', not . or ..); the run directory is <run.dir>/<run.name>"),
      text("run.dir", "runs", "parent folder of run directories"),
      integer("run.lock_stale_s", "300", atLeast(30),
              "a run directory's lock (run.lock) left by a job on another host, container or boot is taken over "
              "once its heartbeat is this many seconds old (one on this machine as soon as its process is gone)"),
      integer("run.seed", "1234", {}, "seed of initialisation, shuffling and dropout"),
      integer("run.log_interval", "100", kPositive, "steps between progress lines and metrics.jsonl step records"),
      integer("run.profile_from", "0", kNonNegative,
              "GPU: the step (1-based) at which the CUDA profiler's capture range starts, so `nsys profile "
              "--capture-range=cudaProfilerApi` or `ncu --profile-from-start off` records run.profile_steps steps "
              "from there, not the setup and the first step's allocations and plans; 0: off"),
      integer("run.profile_steps", "1", kPositive, "steps inside the run.profile_from capture range"),
      boolean("run.trace", "false", "write per-step communication timestamps to <run_dir>/trace.jsonl"),
      integer("run.metrics_port", "0", within(0, 65535, false, false),
              "rank 0 serves Prometheus metrics on http://<run.metrics_bind>:<port>/metrics, every rank's figures "
              "included (docs/metrics.md); 0: off. A port in use is a warning, and the run goes on"),
      text("run.metrics_bind", "0.0.0.0",
           "address the metrics endpoint listens on, an IP address: 0.0.0.0 (every interface: Prometheus usually "
           "scrapes from another host) or 127.0.0.1 (this host only); an IPv6 one (::, ::1) serves IPv6 only"),
      real("run.metrics_linger_s", "15", within(0, 3600, false, false),
           "at exit, rank 0 keeps serving until one scrape has read the exit cause, at most this long (set it to "
           "the scrape interval; 0: no wait); the final figures also go to <run_dir>/metrics.prom"),
      choice("run.log_level", "info", choicesOf(logLevels()), "MT_LOG_LEVEL overrides"),
      // model
      choice("model.type", "mlp", {{"mlp", ""}, {"cnn", ""}, {"gpt", ""}}),
      intList("model.hidden", "256,128,100", "mlp: hidden layer widths"),
      choice("model.activation", "relu", {{"relu", ""}, {"gelu", ""}}, "mlp"),
      real("model.dropout", "0", kFraction, "dropout probability after hidden layers"),
      choice("model.layout", "nhwc", choicesOf(layouts()), "cnn: activation layout"),
      intList("model.conv_channels", "32,64", "cnn: output channels of each conv + pool stage"),
      integer("model.kernel", "3", within(1, 255, false, false), "cnn: convolution kernel size (odd; padding keeps the size)"),
      integer("model.fc", "128", within(1, kMaxWidth, false, false), "cnn: width of the hidden fully-connected layer"),
      choice("model.gpt_preset", "d12",
             {{"d6", ""},
              {"d12", "GPT-2 124M"},
              {"d24", "350M"},
              {"d36", "774M"},
              {"d48", "1558M"},
              {"gpt3-2.7b", "32 x 2560, 20 heads of 128"},
              {"gpt3-6.7b", "32 x 4096, 32 heads of 128"}},
             "gpt"),
      integer("model.layers", "0", within(0, 4096, false, false), "gpt: transformer blocks (0: the preset's)"),
      integer("model.heads", "0", within(0, 4096, false, false), "gpt: attention heads (0: the preset's)"),
      integer("model.channels", "0", within(0, kMaxWidth, false, false), "gpt: embedding width (0: the preset's)"),
      integer("model.seq_len", "1024", within(1, 1 << 24, false, false), "gpt: tokens per sample (T)"),
      integer("model.vocab_size", "0", within(0, kMaxVocab, false, false), "gpt: vocabulary (0: the data file's vocab_size)"),
      integer("model.padded_vocab", "0", within(0, kMaxVocab, false, false),
              "gpt: vocabulary padded for aligned GEMMs (0: next multiple of 128)"),
      choice("model.attention", "auto", choicesOf(attentionBackends()),
             "gpt, cuda in bf16/f16: the fused attention kernel (the first use of each shape logs which runs and "
             "why); the CPU and f32 precision ignore it"),
      real("model.input_mean", "0.2860", {}, "image normalisation mean (of pixel/255)"),
      real("model.input_std", "0.3530", kPositive, "image normalisation standard deviation"),
      // data
      text("data.path", "datasets/fashion_mnist.h5", "HDF5 file (docs/data-format.md)"),
      text("data.train_split", "train", "group holding the training images/labels"),
      text("data.test_split", "test", "group holding the test images/labels"),
      choice("data.mode", "memory",
             {{"memory", "load the split into RAM once"}, {"stream", "read batches from the file"}}),
      choice("data.feed", "pinned", choicesOf(feedModes()), "cuda: how batches reach the GPU"),
      integer("data.num_workers", "2", kNonNegative, "loader worker threads per rank (0: load in the training thread)"),
      integer("data.prefetch_factor", "2", atLeast(1), "batches in flight per worker"),
      boolean("data.shuffle", "true", "shuffle the training set every epoch"),
      choice("data.file_locking", "auto", choicesOf(fileLockings()), "HDF5 file locking"),
      // train
      integer("train.epochs", "10", {}, "epochs to train (ignored when train.max_steps > 0)"),
      integer("train.max_steps", "0", kNonNegative, "stop after this many optimizer steps (0: train.epochs)"),
      integer("train.batch_size", "128", kPositive, "GLOBAL batch size, split evenly over ranks"),
      integer("train.grad_accum_steps", "1", atLeast(1),
              "micro-batches per optimizer step: each rank's share of train.batch_size runs in this many forward/"
              "backward passes whose gradients add up locally (one all-reduce, after the last)"),
      choice("train.activation_checkpointing", "none", choicesOf(activationCheckpointings()),
             "gpt: what a training forward keeps of each block; backward recomputes the rest"),
      integer("train.activation_checkpointing_every", "1", atLeast(1),
              "gpt: checkpoint blocks 0, k, 2k, ... only (1: every block)"),
      choice("train.gradient_buffers", "auto",
             {{"auto", "per_step with train.device = cuda, persistent on the CPU"},
              {"per_step",
               "no_shard: each unit's (or data-parallel bucket's) gradient buffer is made when backward "
               "reaches it and freed after the optimizer step, as PyTorch's zero_grad(set_to_none=True): "
               "the activations' peak at the start of backward holds almost no gradients"},
              {"persistent", "one gradient buffer for the whole run, zeroed before each step"}}),
      integer("train.eval_batch_size", "1000", kPositive, "global batch size for evaluation"),
      integer("train.eval_interval", "0", kNonNegative, "steps between evaluations (0: at the end of every epoch)"),
      choice("train.device", "cpu", {{"cpu", ""}, {"cuda", "GPU = node-local rank modulo the visible GPUs"}}),
      choice("train.precision", "f32",
             {{"f32", ""},
              {"bf16", "bf16 matmuls, f32 master weights"},
              {"f16", "plus dynamic loss scaling"},
              {"fp8",
               "gpt: the block Linears (fp8.layers) multiply in FP8 with per-tensor scaling (fp8.*), the "
               "rest as bf16; on the CPU the FP8 rounding is emulated around f32"}}),
      real("train.loss_scale_init", "65536", within(1, 1e15, false, false),
           "f16: the loss scaler's first scale (torch GradScaler's init_scale); halved at every step with "
           "inf/nan gradients, which is skipped"),
      integer("train.loss_scale_growth_interval", "2000", atLeast(1),
              "f16: clean steps in a row after which the loss scale doubles (GradScaler's growth_interval)"),
      integer("train.memory_cap_mb", "0", kNonNegative,
              "cuda: cap on GPU memory the caching allocator may reserve (0: none)"),
      real("train.grad_clip", "0", kNonNegative, "clip the global gradient norm to this (0: off)"),
      integer("train.divergence_steps", "3", atLeast(1),
              "consecutive steps with a non-finite loss that stop the run as diverged (exit 4; no checkpoint of "
              "non-finite weights is ever written)"),
      boolean("train.qat", "false",
              "quantization-aware training: int8 fake quantization of every linear / conv2d (weights per output "
              "channel, activations per tensor, straight-through gradients; mlp and cnn); export with trainer export "
              "--format onnx --quantize int8"),
      choice("train.qat_observer", "minmax",
             {{"minmax", "the activation ranges are the min and max seen"},
              {"ema", "moving averages of each batch's min and max (constant 0.01)"}}),
      integer("train.qat_observe_steps", "200", kPositive,
              "train.qat: the observers update during the first N optimizer steps, then are frozen"),
      integer("train.eval_batches", "20", kPositive, "gpt: batches of the test split per evaluation"),
      real("train.peak_flops", "989e12", kPositive, "peak FLOP/s per GPU for the MFU figure (H100/H200 dense bf16)"),
      // optim
      choice("optim.type", "adamw", {{"sgd", ""}, {"adamw", ""}}),
      real("optim.lr", "0.001", kPositive, "peak learning rate"),
      real("optim.weight_decay", "0", kNonNegative,
           "decoupled (adamw) or L2 (sgd) weight decay; biases and norms excluded"),
      real("optim.momentum", "0.9", kFraction, "sgd momentum"),
      boolean("optim.nesterov", "false", "sgd Nesterov momentum"),
      real("optim.beta1", "0.9", kFraction, "adamw beta1"),
      real("optim.beta2", "0.999", kFraction, "adamw beta2"),
      real("optim.eps", "1e-8", kPositive, "adamw epsilon"),
      // schedule
      choice("schedule.kind", "constant", {{"constant", ""}, {"cosine", ""}, {"linear", ""}}),
      integer("schedule.warmup_steps", "0", kNonNegative, "linear warmup steps"),
      real("schedule.min_lr", "0", kNonNegative, "final learning rate of cosine/linear decay"),
      // dist
      choice("dist.backend", "auto",
             {{"auto", "nccl on GPUs, mpi on CPUs, local for one rank"}, {"mpi", ""}, {"local", ""}, {"nccl", ""}}),
      real("dist.bucket_cap_mb", "25", kPositive, "gradient bucket size in MiB"),
      real("dist.first_bucket_mb", "1", kPositive, "size of the first (last layers') bucket in MiB"),
      boolean("dist.rebuild_buckets", "false", "rebuild buckets after step 1 from the observed gradient order"),
      // Deadlines are steady_clock time points: 1e10 s overflowed and every collective timed out.
      integer("dist.timeout_s", "300", within(1, 604800, false, false),
              "collective timeout in seconds, at most a week (MT_COMM_TIMEOUT_S overrides)"),
      boolean("dist.fingerprint", "false", "check that all ranks issue the same collective (debug; slow)"),
      boolean("dist.health_monitor", "true", "detect killed ranks at once through a TCP connection to rank 0"),
      // compression
      choice("compression.method", "none", choicesOf(compressionMethods()), "data-parallel gradient compression"),
      integer("compression.rank", "4", atLeast(1), "powersgd: rank of the low-rank approximation"),
      integer("compression.start_iter", "10", kNonNegative,
              "powersgd, topk: steps of uncompressed all-reduce before compressing"),
      real("compression.min_compression_rate", "2", atLeast(1),
           "powersgd: compress a matrix only when it saves this factor"),
      boolean("compression.warm_start", "true", "powersgd: start each step's power iteration from last step's Q"),
      boolean("compression.error_feedback", "true", "powersgd, topk: add what compression left out to the next step"),
      real("compression.topk_fraction", "0.01", within(0, 1, true, false), "topk: fraction of each bucket's entries sent"),
      integer("compression.topk_warmup_steps", "0", kNonNegative,
              "topk: steps after start_iter over which the fraction falls geometrically from 1 to topk_fraction"),
      // fp8 (train.precision = fp8)
      choice("fp8.recipe", "delayed", choicesOf(fp8Recipes()),
             "per-tensor scales fp8_max / amax / 2^fp8.margin (core/Fp8.h)"),
      integer("fp8.amax_history", "16", within(1, 1024, false, false),
              "delayed: casts whose amax the scale covers"),
      integer("fp8.margin", "0", within(0, 16, false, false),
              "scales divided by 2^margin (headroom for growth)"),
      choice("fp8.grad_format", "e5m2", choicesOf(fp8Formats()),
             "format of the output gradients in backward (activations and weights are e4m3)"),
      text("fp8.layers", "qkv,proj,fc,fcproj",
           "which block Linears run in FP8 (comma-separated: qkv, proj, fc, fcproj); the others stay bf16"),
      // sharding
      choice("sharding.strategy", "no_shard", choicesOf(shardStrategies())),
      choice("sharding.offload", "none",
             {{"none", ""},
              {"cpu", "master shards, gradient shards and optimizer state in host memory, step on the CPU; "
                      "the GPU keeps the gather copy"}}),
      boolean("sharding.delayed_update", "false",
              "offload = cpu: the CPU step of one iteration runs during the next one's forward and backward, "
              "which use the parameters one step older (DeepSpeed's delayed parameter update)"),
      real("sharding.offload_fraction", "1", within(0, 1, true, false),
           "offload = cpu: the share of the parameters whose optimizer runs on the CPU — the last units; the "
           "first ones keep master, gradient shard and optimizer state on the GPU and step there while the "
           "CPU steps the rest (ZeRO-Offload++'s twin flow: less CPU time, more GPU memory)"),
      integer("sharding.prefetch_limit", "2", atLeast(1),
              "the unit computing plus all-gathers in flight (units kept gathered for backward do not count)"),
      choice("sharding.param_dtype", "auto",
             {{"auto", "bf16 with sharding.offload = cpu under bf16/f16/fp8 compute, so the GPU keeps 2 bytes a "
                       "parameter; else f32"},
              {"f32", ""},
              {"bf16", ""}},
             "dtype of the gather copy on the device, which parameters are all-gathered in"),
      choice("sharding.reduce_dtype", "f32", {{"f32", ""}, {"bf16", ""}}, "dtype gradients are reduce-scattered in"),
      // checkpoint
      text("checkpoint.dir", "", "where checkpoints go (default <run_dir>/checkpoints; shared by all nodes)"),
      integer("checkpoint.interval", "0", kNonNegative, "save every this many steps (0: only at exit)"),
      integer("checkpoint.keep", "3", atLeast(1), "keep the newest this many checkpoints"),
      text("checkpoint.resume", "auto", "auto (the newest valid checkpoint, if any), never, or a checkpoint directory"),
      boolean("checkpoint.at_exit", "true", "save when training ends and when SIGTERM/SIGUSR1 stops it"),
      integer("checkpoint.timeout_s", "1800", within(1, 604800, false, false),
              "how long ranks wait for each other while a checkpoint is written, verified or read "
              "(dist.timeout_s bounds training steps; the health monitor names a lost rank within seconds)"),
      // topo
      text("topo.file", "",
           "NCCL topology XML of a node (NCCL_TOPO_FILE); rails, node groups and CPU affinity come from it (a file "
           "that lists some rank's GPU bus id nowhere is refused: exit 2)"),
      text("topo.profile", "",
           "environment profile: a name in topo/profiles (ib-ndr, ib-hdr, roce-v2, socket, ...) or a path"),
      boolean("topo.hierarchical", "false",
              "data-parallel all-reduce as reduce-scatter in node, all-reduce across, all-gather in"),
      integer("topo.node_ranks", "0", kNonNegative,
              "ranks per node for the intra/inter-node groups (0: the real nodes; >0 emulates)"),
      boolean("topo.bind_cpus", "true",
              "cuda: bind each rank to the CPU cores of its GPU's NUMA node, found by PCI bus id in topo.file"),
      boolean("topo.bind_nic", "false",
              "restrict each rank's NCCL to its rail: the NIC(s) nearest its GPU in topo.file, as NCCL_IB_HCA "
              "(NCCL_SOCKET_IFNAME on sockets; EFA/unknown NICs: NCCL chooses); refused when that variable is "
              "set already"),
      boolean("topo.report", "false",
              "rank 0 writes <run_dir>/nccl_report.json: NCCL's version, every NCCL_* variable in effect and where "
              "it came from, each communicator's groups of ranks, and the rings, trees and NICs NCCL chose (read "
              "from its NCCL_DEBUG=INFO output, which goes to <run_dir>/nccl-debug.<host>.<pid>.log)"),
  };
  return kSchema;
}

}  // namespace mt
