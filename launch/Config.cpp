#include "launch/Config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/Error.h"

namespace po = boost::program_options;

namespace mt {

const std::vector<ConfigKey>& configSchema() {
  static const std::vector<ConfigKey> kSchema = {
      // run
      {"run.name", "fashion_mlp", "run name; the run directory is <run.dir>/<run.name>"},
      {"run.dir", "runs", "parent folder of run directories"},
      {"run.seed", "1234", "seed of initialisation, shuffling and dropout"},
      {"run.log_interval", "100", "steps between progress lines and metrics.jsonl step records"},
      {"run.trace", "false", "write per-step communication timestamps to <run_dir>/trace.jsonl"},
      {"run.log_level", "info", "debug, info, warn or error (MT_LOG_LEVEL overrides)"},
      // model
      {"model.type", "mlp", "mlp, cnn or gpt"},
      {"model.hidden", "256,128,100", "mlp: hidden layer widths"},
      {"model.activation", "relu", "mlp: relu or gelu"},
      {"model.dropout", "0", "dropout probability after hidden layers"},
      {"model.layout", "nhwc", "cnn: activation layout, nhwc or nchw"},
      {"model.conv_channels", "32,64", "cnn: output channels of each conv + pool stage"},
      {"model.kernel", "3", "cnn: convolution kernel size (odd; padding keeps the size)"},
      {"model.fc", "128", "cnn: width of the hidden fully-connected layer"},
      {"model.gpt_preset", "d12", "gpt: d6, d12 (GPT-2 124M), d24, d36 or d48"},
      {"model.layers", "0", "gpt: transformer blocks (0: the preset's)"},
      {"model.heads", "0", "gpt: attention heads (0: the preset's)"},
      {"model.channels", "0", "gpt: embedding width (0: the preset's)"},
      {"model.seq_len", "1024", "gpt: tokens per sample (T)"},
      {"model.vocab_size", "0", "gpt: vocabulary (0: the data file's vocab_size)"},
      {"model.padded_vocab", "0", "gpt: vocabulary padded for aligned GEMMs (0: next multiple of 128)"},
      {"model.input_mean", "0.2860", "image normalisation mean (of pixel/255)"},
      {"model.input_std", "0.3530", "image normalisation standard deviation"},
      // data
      {"data.path", "datasets/fashion_mnist.h5", "HDF5 file (docs/data-format.md)"},
      {"data.train_split", "train", "group holding the training images/labels"},
      {"data.test_split", "test", "group holding the test images/labels"},
      {"data.mode", "memory", "memory: load the split into RAM once; stream: read batches from the file"},
      {"data.feed", "pinned", "cuda: pinned (copy stream from page-locked memory), uvm (managed memory, prefetched) or device (split resident on the GPU; needs data.mode = memory)"},
      {"data.num_workers", "2", "loader worker threads per rank (0: load in the training thread)"},
      {"data.prefetch_factor", "2", "batches in flight per worker"},
      {"data.shuffle", "true", "shuffle the training set every epoch"},
      {"data.file_locking", "auto", "HDF5 file locking: auto (HDF5_USE_FILE_LOCKING decides), on or off"},
      // train
      {"train.epochs", "10", "epochs to train (ignored when train.max_steps > 0)"},
      {"train.max_steps", "0", "stop after this many optimizer steps (0: train.epochs)"},
      {"train.batch_size", "128", "GLOBAL batch size, split evenly over ranks"},
      {"train.grad_accum_steps", "1",
       "micro-batches per optimizer step: each rank's share of train.batch_size runs in this many forward/"
       "backward passes whose gradients add up locally (one all-reduce, after the last)"},
      {"train.eval_batch_size", "1000", "global batch size for evaluation"},
      {"train.eval_interval", "0", "steps between evaluations (0: at the end of every epoch)"},
      {"train.device", "cpu", "cpu or cuda (GPU = node-local rank modulo the visible GPUs)"},
      {"train.precision", "f32", "f32, bf16 (bf16 matmuls, f32 master weights) or f16 (plus dynamic loss scaling)"},
      {"train.memory_cap_mb", "0", "cuda: cap on GPU memory the caching allocator may reserve (0: none)"},
      {"train.grad_clip", "0", "clip the global gradient norm to this (0: off)"},
      {"train.eval_batches", "20", "gpt: batches of the test split per evaluation"},
      {"train.peak_flops", "989e12", "peak FLOP/s per GPU for the MFU figure (H100/H200 dense bf16)"},
      // optim
      {"optim.type", "adamw", "sgd or adamw"},
      {"optim.lr", "0.001", "peak learning rate"},
      {"optim.weight_decay", "0", "decoupled (adamw) or L2 (sgd) weight decay; biases and norms excluded"},
      {"optim.momentum", "0.9", "sgd momentum"},
      {"optim.nesterov", "false", "sgd Nesterov momentum"},
      {"optim.beta1", "0.9", "adamw beta1"},
      {"optim.beta2", "0.999", "adamw beta2"},
      {"optim.eps", "1e-8", "adamw epsilon"},
      // schedule
      {"schedule.kind", "constant", "constant, cosine or linear"},
      {"schedule.warmup_steps", "0", "linear warmup steps"},
      {"schedule.min_lr", "0", "final learning rate of cosine/linear decay"},
      // dist
      {"dist.backend", "auto", "auto (nccl on GPUs, mpi on CPUs, local for one rank), mpi, local or nccl"},
      {"dist.bucket_cap_mb", "25", "gradient bucket size in MiB"},
      {"dist.first_bucket_mb", "1", "size of the first (last layers') bucket in MiB"},
      {"dist.rebuild_buckets", "false", "rebuild buckets after step 1 from the observed gradient order"},
      {"dist.timeout_s", "300", "collective timeout in seconds (MT_COMM_TIMEOUT_S overrides)"},
      {"dist.fingerprint", "false", "check that all ranks issue the same collective (debug; slow)"},
      {"dist.health_monitor", "true", "detect killed ranks at once through a TCP connection to rank 0"},
      // compression
      {"compression.method", "none", "data-parallel gradient compression: none, fp16, bf16, powersgd or topk"},
      {"compression.rank", "4", "powersgd: rank of the low-rank approximation"},
      {"compression.start_iter", "10", "powersgd, topk: steps of uncompressed all-reduce before compressing"},
      {"compression.min_compression_rate", "2", "powersgd: compress a matrix only when it saves this factor"},
      {"compression.warm_start", "true", "powersgd: start each step's power iteration from last step's Q"},
      {"compression.error_feedback", "true", "powersgd, topk: add what compression left out to the next step"},
      {"compression.topk_fraction", "0.01", "topk: fraction of each bucket's entries sent"},
      {"compression.topk_warmup_steps", "0", "topk: steps after start_iter over which the fraction falls geometrically from 1 to topk_fraction"},
      // sharding
      {"sharding.strategy", "no_shard", "no_shard (data parallel), full_shard, shard_grad_op or hybrid_shard"},
      {"sharding.offload", "none", "none, or cpu: master shards and optimizer state in host memory, step on the CPU"},
      {"sharding.prefetch_limit", "2", "units gathered at once (the current one and the prefetched)"},
      {"sharding.param_dtype", "f32", "dtype parameters are all-gathered in: f32 or bf16"},
      {"sharding.reduce_dtype", "f32", "dtype gradients are reduce-scattered in: f32 or bf16"},
      // checkpoint
      {"checkpoint.dir", "", "where checkpoints go (default <run_dir>/checkpoints; shared by all nodes)"},
      {"checkpoint.interval", "0", "save every this many steps (0: only at exit)"},
      {"checkpoint.keep", "3", "keep the newest this many checkpoints"},
      {"checkpoint.resume", "auto", "auto (the newest valid checkpoint, if any), never, or a checkpoint directory"},
      {"checkpoint.at_exit", "true", "save when training ends and when SIGTERM/SIGUSR1 stops it"},
      // topo
      {"topo.file", "", "NCCL topology XML of a node (NCCL_TOPO_FILE); rails and CPU affinity come from it"},
      {"topo.profile", "", "environment profile: a name in topo/profiles (ib-ndr, ib-hdr, roce-v2, socket, ...) or a path"},
      {"topo.hierarchical", "false", "data-parallel all-reduce as reduce-scatter in node, all-reduce across, all-gather in"},
      {"topo.node_ranks", "0", "ranks per node for the intra/inter-node groups (0: the real nodes; >0 emulates)"},
      {"topo.bind_cpus", "true", "cuda: bind each rank to the CPU cores of its GPU's NUMA node (needs topo.file)"},
  };
  return kSchema;
}

namespace {

const ConfigKey* findKey(const std::string& key) {
  for (const auto& k : configSchema())
    if (k.key == key) return &k;
  return nullptr;
}

// " (did you mean 'train.epochs'?)" for a key within a small edit distance of a known one.
std::string suggestKey(const std::string& key) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  const std::string* best = nullptr;
  size_t bestD = 0;
  for (const auto& k : configSchema()) {
    const size_t d = distance(key, k.key);
    if (!best || d < bestD) best = &k.key, bestD = d;
  }
  if (!best || bestD > std::max<size_t>(2, key.size() / 4)) return "";
  return " (did you mean '" + *best + "'?)";
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

po::options_description makeDescription() {
  po::options_description desc("meshtrain configuration");
  for (const auto& k : configSchema()) desc.add_options()(k.key.c_str(), po::value<std::string>(), k.help.c_str());
  return desc;
}

}  // namespace

Config Config::defaults() {
  Config c;
  for (const auto& k : configSchema()) c.values_[k.key] = k.defaultValue;
  return c;
}

Config Config::fromFile(const std::string& path, const std::map<std::string, std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("config error: cannot read config file " + path + ": " + std::strerror(errno));
  return fromStream(in, path, overrides);
}

Config Config::fromStream(std::istream& in, const std::string& path,
                          const std::map<std::string, std::string>& overrides) {
  Config c = defaults();
  c.source_ = path;
  po::options_description desc = makeDescription();
  po::variables_map vm;
  try {
    po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
  } catch (const po::unknown_option& e) {
    throw ConfigError("config error: " + path + ": unknown key '" + e.get_option_name() + "'" +
                      suggestKey(e.get_option_name()));
  } catch (const po::multiple_occurrences& e) {
    throw ConfigError("config error: " + path + ": key '" + e.get_option_name() + "' given twice");
  } catch (const po::error& e) {
    throw ConfigError("config error: " + path + ": " + e.what());
  }
  for (const auto& kv : vm) c.values_[kv.first] = trim(kv.second.as<std::string>());
  for (const auto& kv : overrides) {
    if (!findKey(kv.first))
      throw ConfigError("config error: --" + kv.first + ": unknown key '" + kv.first + "'" + suggestKey(kv.first));
    c.values_[kv.first] = trim(kv.second);
    c.overridden_.insert(kv.first);
  }
  return c;
}

Config Config::fromArgs(const std::vector<std::string>& args) {
  std::string file;
  std::map<std::string, std::string> overrides;
  bool help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw ConfigError("config error: unexpected argument '" + a + "' (options are --key=value)");
    std::string body = a.substr(2), value;
    size_t eq = body.find('=');
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    } else {
      throw ConfigError("config error: --" + body + " needs a value (--" + body + "=VALUE)");
    }
    if (body == "config") file = value;
    else if (!findKey(body))
      throw ConfigError("config error: --" + body + ": unknown key '" + body + "'" + suggestKey(body));
    else overrides[body] = value;
  }
  Config c;
  if (file.empty()) {
    c = defaults();
    for (const auto& kv : overrides) {
      c.values_[kv.first] = trim(kv.second);
      c.overridden_.insert(kv.first);
    }
  } else {
    c = fromFile(file, overrides);
  }
  c.help_ = help;
  return c;
}

void Config::fail(const std::string& key, const std::string& why) const {
  auto it = values_.find(key);
  const std::string value = it == values_.end() ? "" : it->second;
  if (overridden_.count(key)) throw ConfigError("config error: --" + key + "=" + value + ": " + why);
  throw ConfigError("config error: " + source_ + ": " + key + " = '" + value + "': " + why);
}

std::string Config::str(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw InternalError("config key " + key + " is not in the schema");
  return it->second;
}

int64_t Config::i64(const std::string& key) const {
  const std::string s = str(key);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) fail(key, "not an integer");
  return v;
}

double Config::f64(const std::string& key) const {
  const std::string s = str(key);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE) fail(key, "not a number");
  // inf and nan parse as numbers; no key of ours means either (they train to NaN and exit 0).
  if (!std::isfinite(v)) fail(key, "must be a finite number");
  return v;
}

bool Config::flag(const std::string& key) const {
  const std::string s = str(key);
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  fail(key, "not a boolean (true or false)");
}

std::vector<int64_t> Config::i64List(const std::string& key) const {
  std::vector<int64_t> out;
  std::stringstream ss(str(key));
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) fail(key, "not a comma-separated list of integers");
    out.push_back(v);
  }
  return out;
}

std::string Config::choice(const std::string& key, const std::vector<std::string>& allowed) const {
  const std::string s = str(key);
  std::string list;
  for (const auto& a : allowed) {
    if (a == s) return s;
    list += (list.empty() ? "" : ", ") + a;
  }
  fail(key, "expected one of " + list);
}

void Config::set(const std::string& key, const std::string& value) {
  if (!findKey(key)) throw InternalError("config key " + key + " is not in the schema");
  values_[key] = value;
}

std::string Config::toIni() const {
  std::ostringstream os;
  os << "# resolved configuration (from " << source_ << ", defaults included)\n";
  std::string section;
  for (const auto& k : configSchema()) {
    const std::string sec = k.key.substr(0, k.key.find('.'));
    if (sec != section) {
      os << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    os << k.key.substr(k.key.find('.') + 1) << " = " << values_.at(k.key) << "\n";
  }
  return os.str();
}

std::string configHelp() {
  std::ostringstream os;
  os << "usage: trainer [--config FILE.ini] [--section.key=value ...]   train (under mpirun/srun for several ranks)\n"
        "       trainer --help          this text: every key with its default\n"
        "       trainer --help-env      the MT_* environment variables\n"
        "       trainer --devices       how many GPUs this build can use here\n"
        "       trainer topo --help     read an NCCL topology file (GPUs, NICs, rails, fabric)\n"
        "       trainer predict --help  the fabric cost model: step time and scaling per node count\n"
        "       trainer export --help   a checkpoint's parameters and architecture as one HDF5 file\n"
        "       trainer plan --help     per-rank memory of a configuration, before allocating anything\n"
        "\nkeys (section.key = default: meaning):\n";
  for (const auto& k : configSchema()) os << "  " << k.key << " = " << k.defaultValue << "\n      " << k.help << "\n";
  return os.str();
}

}  // namespace mt
