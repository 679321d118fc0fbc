#include "launch/Config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <sstream>

#include "core/Error.h"
#include "core/Files.h"

namespace po = boost::program_options;

namespace mt {

namespace {

constexpr uint64_t kConfigFileLimit = 1ull << 20;  // an INI of every key is a few KB

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

bool KeyRange::contains(double v) const {
  return (loOpen ? v > lo : v >= lo) && (hiOpen ? v < hi : v <= hi);
}

std::string KeyRange::describe() const {
  const bool hasLo = lo > -1e308, hasHi = hi < 1e308;
  if (hasLo && hasHi)
    return "must be in " + std::string(loOpen ? "(" : "[") + number(lo) + ", " + number(hi) + (hiOpen ? ")" : "]");
  if (hasLo) return lo == 0 && loOpen ? "must be positive" : std::string("must be ") + (loOpen ? "> " : ">= ") + number(lo);
  if (hasHi) return std::string("must be ") + (hiOpen ? "< " : "<= ") + number(hi);
  return "";
}

std::vector<std::string> ConfigKey::choiceNames() const {
  std::vector<std::string> out;
  for (const auto& c : choices) out.push_back(c.name);
  return out;
}

std::string ConfigKey::helpText() const {
  if (kind != KeyKind::kChoice) return help;
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) list += i + 1 == choices.size() ? " or " : ", ";
    list += choices[i].name;
    if (!choices[i].meaning.empty()) list += " (" + choices[i].meaning + ")";
  }
  return help.empty() ? list : help + ": " + list;
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
  // A directory would read as an empty file (the built-in defaults, trained with rc 0) and a device
  // without end; a config is a regular file of human size.
  std::string text, why;
  if (!readWholeFile(path, &text, &why, kConfigFileLimit))
    throw ConfigError("config error: cannot read config file " + path + ": " + why);
  std::istringstream in(text);
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
    if (body == "config" && value.empty())
      throw ConfigError("config error: --config needs a file (--config=FILE.ini)");
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

void Config::validate() const {
  for (const auto& k : configSchema()) {
    switch (k.kind) {
      case KeyKind::kString:
        break;
      case KeyKind::kInt: {
        const int64_t v = i64(k.key);
        if (!k.range.contains(static_cast<double>(v))) fail(k.key, k.range.describe());
        break;
      }
      case KeyKind::kFloat: {
        const double v = f64(k.key);
        if (!k.range.contains(v)) fail(k.key, k.range.describe());
        break;
      }
      case KeyKind::kBool:
        flag(k.key);
        break;
      case KeyKind::kIntList:
        i64List(k.key);
        break;
      case KeyKind::kChoice:
        choice(k.key, k.choiceNames());
        break;
    }
  }
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
        "       trainer --help-nccl     the NCCL_* variables profiles and the environment are checked against\n"
        "       trainer --config-reference   every key as the README's markdown table\n"
        "       trainer --devices       how many GPUs this build can use here\n"
        "       trainer --version       version, commit, CUDA/NCCL/cuDNN/MPI/HDF5 built with, run with\n"
        "       trainer topo --help     read an NCCL topology file (GPUs, NICs, rails, fabric)\n"
        "       trainer predict --help  the fabric cost model: step time and scaling per node count\n"
        "       trainer export --help   a checkpoint as one HDF5 file (parameters, architecture) or an ONNX model\n"
        "       trainer logits --help   the trainer's forward of a checkpoint on test samples (export checks)\n"
        "       trainer plan --help     per-rank memory of a configuration, before allocating anything\n"
        "\nkeys (section.key = default: meaning):\n";
  for (const auto& k : configSchema()) {
    os << "  " << k.key << " = " << k.defaultValue << "\n      " << k.helpText();
    if (k.range.bounded()) os << " [" << k.range.describe().substr(std::string("must be ").size()) << "]";
    os << "\n";
  }
  return os.str();
}

std::string configReferenceMarkdown() {
  std::ostringstream os;
  os << "| key | default | meaning |\n| --- | --- | --- |\n";
  for (const auto& k : configSchema()) {
    std::string meaning = k.helpText();
    if (k.range.bounded()) meaning += " (" + k.range.describe().substr(std::string("must be ").size()) + ")";
    os << "| `" << k.key << "` | " << (k.defaultValue.empty() ? "(empty)" : "`" + k.defaultValue + "`") << " | "
       << meaning << " |\n";
  }
  return os.str();
}

}  // namespace mt
