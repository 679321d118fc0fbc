#pragma once
// Objects an owner keeps on behalf of code above it in the dependency order: CudaRuntime (core/)
// holds the GEMM and convolution plan caches of models/kernels this way, so each runtime has its
// own (plans chosen with its handles, on its device) and destroys them before its handles.
// One object per type, default-constructed on first use; destroyed in the reverse order of
// creation by clear() or the set's destructor. A component's constructor must not ask the same
// set for another component (the set's lock is held while it runs).

#include <map>
#include <memory>
#include <mutex>
#include <typeindex>
#include <typeinfo>
#include <vector>

namespace mt {

class ComponentSet {
 public:
  ComponentSet() = default;
  ~ComponentSet() { clear(); }
  ComponentSet(const ComponentSet&) = delete;
  ComponentSet& operator=(const ComponentSet&) = delete;

  // The set's T, made on first use. Thread-safe; the reference stays valid until clear().
  template <typename T>
  T& get() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::type_index key(typeid(T));
    auto it = index_.find(key);
    if (it != index_.end()) return static_cast<Holder<T>&>(*owned_[it->second]).value;
    auto holder = std::make_unique<Holder<T>>();
    T& ref = holder->value;
    owned_.push_back(std::move(holder));
    index_.emplace(key, owned_.size() - 1);
    return ref;
  }
  // Destroys every component, the newest first.
  void clear() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!owned_.empty()) owned_.pop_back();
    index_.clear();
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return owned_.size();
  }

 private:
  struct Base {
    virtual ~Base() = default;
  };
  template <typename T>
  struct Holder final : Base {
    T value;
  };
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Base>> owned_;
  std::map<std::type_index, size_t> index_;
};

}  // namespace mt
