#pragma once
// The trainer's configuration: an INI file (sections become "section.key") plus `--section.key=value`
// overrides on the command line, which win. Every key is declared once in the schema (Config.cpp)
// with its default, kind, accepted range or names, and help text; an unknown key, a bad value or a missing file is a ConfigError
// naming the key or file (exit code 2). The resolved configuration — defaults included — is
// written to <run_dir>/config.ini so a run can be repeated exactly.

#include <cstdint>
#include <istream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mt {

// What a key's value is, and what range or names it accepts: Config::validate() checks every key
// against its entry, --help and the README's configuration reference are generated from it.
enum class KeyKind { kString, kInt, kFloat, kBool, kIntList, kChoice };

struct KeyChoice {
  std::string name, meaning;  // meaning may be empty
};

struct KeyRange {
  double lo = -1e308, hi = 1e308;
  bool loOpen = false, hiOpen = false;  // open: the bound itself is excluded
  bool bounded() const { return lo > -1e308 || hi < 1e308; }
  bool contains(double v) const;
  std::string describe() const;  // "must be positive", "must be >= 1", "must be in [0, 1)"
};

struct ConfigKey {
  std::string key;  // "train.lr"
  std::string defaultValue;
  KeyKind kind = KeyKind::kString;
  std::string help;
  KeyRange range;                 // kInt, kFloat
  std::vector<KeyChoice> choices;  // kChoice
  // help with the choices spelt out: "cuda: pinned (copy stream ...), uvm (...) or device (...)".
  std::string helpText() const;
  std::vector<std::string> choiceNames() const;
};

const std::vector<ConfigKey>& configSchema();

class Config {
 public:
  // Parses argv (after the program name and subcommand). Throws ConfigError.
  static Config fromArgs(const std::vector<std::string>& args);
  // Parses an INI file and overrides ("section.key" -> value). Throws ConfigError.
  static Config fromFile(const std::string& path, const std::map<std::string, std::string>& overrides = {});
  // The same from INI text already read (`name` is what errors call it).
  static Config fromStream(std::istream& in, const std::string& name,
                           const std::map<std::string, std::string>& overrides = {});
  static Config defaults();

  std::string str(const std::string& key) const;
  int64_t i64(const std::string& key) const;
  double f64(const std::string& key) const;
  bool flag(const std::string& key) const;
  std::vector<int64_t> i64List(const std::string& key) const;
  // One of `allowed`, else ConfigError listing them.
  std::string choice(const std::string& key, const std::vector<std::string>& allowed) const;
  void set(const std::string& key, const std::string& value);

  // Throws ConfigError "<key> = <value>: <why>" — for checks made by the code that uses a value.
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;

  // Every key against its entry in the schema (kind, range, choices); the first bad one is a
  // ConfigError naming it.
  void validate() const;

  std::string toIni() const;
  const std::string& source() const { return source_; }  // the config file, or "defaults"
  bool helpRequested() const { return help_; }

 private:
  std::map<std::string, std::string> values_;
  std::string source_ = "defaults";
  std::set<std::string> overridden_;  // keys given on the command line (named as such in errors)
  bool help_ = false;
};

std::string configHelp();
// The README's configuration reference: a markdown table of every key, default and meaning.
std::string configReferenceMarkdown();

}  // namespace mt
