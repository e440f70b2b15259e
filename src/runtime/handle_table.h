// Handle tables: map the opaque handles of the public API to objects.
//
// A handle encodes (kind, generation, slot). The generation comes from a
// process-wide counter, so a handle from a destroyed object, an earlier
// tern_init session or another kind of object never resolves: the API
// answers TERN_ERROR_INVALID_HANDLE instead of touching freed memory.
#ifndef TERN_SRC_RUNTIME_HANDLE_TABLE_H_
#define TERN_SRC_RUNTIME_HANDLE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

namespace tern {

enum class HandleKind : uint8_t {
  kDevice = 1,
  kCore = 2,
  kBuffer = 3,
  kQueue = 4,
  kEvent = 5,
  kExecutable = 6,
  kComm = 7,
};

// Next generation for any handle of any table in this process.
uint32_t NextHandleGeneration();

// Thread-safety: every method may be called concurrently.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(HandleKind kind) : kind_(kind) {}

  uint64_t Insert(std::shared_ptr<T> object) {
    std::unique_lock lock(mutex_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    const uint32_t generation = NextHandleGeneration() & 0xffffff;
    slots_[index].generation = generation;
    slots_[index].object = std::move(object);
    ++live_;
    return (static_cast<uint64_t>(kind_) << 56) | (static_cast<uint64_t>(generation) << 32) |
           (static_cast<uint64_t>(index) + 1);
  }

  std::shared_ptr<T> Lookup(uint64_t handle) const {
    uint32_t index, generation;
    if (!Decode(handle, &index, &generation)) return nullptr;
    std::shared_lock lock(mutex_);
    if (index >= slots_.size() || slots_[index].generation != generation) return nullptr;
    return slots_[index].object;
  }

  // Removes and returns the object, or nullptr if the handle is not live.
  std::shared_ptr<T> Remove(uint64_t handle) {
    uint32_t index, generation;
    if (!Decode(handle, &index, &generation)) return nullptr;
    std::unique_lock lock(mutex_);
    if (index >= slots_.size() || slots_[index].generation != generation || !slots_[index].object) {
      return nullptr;
    }
    std::shared_ptr<T> object = std::move(slots_[index].object);
    slots_[index].generation = kDeadGeneration;
    free_.push_back(index);
    --live_;
    return object;
  }

  // Removes every object (runtime shutdown), returning them.
  std::vector<std::shared_ptr<T>> Clear() {
    std::unique_lock lock(mutex_);
    std::vector<std::shared_ptr<T>> objects;
    for (auto& slot : slots_) {
      if (slot.object) objects.push_back(std::move(slot.object));
    }
    slots_.clear();
    free_.clear();
    live_ = 0;
    return objects;
  }

  size_t live() const {
    std::shared_lock lock(mutex_);
    return live_;
  }

 private:
  static constexpr uint32_t kDeadGeneration = 0xffffffffu;  // never produced by Insert
  struct Slot {
    uint32_t generation = kDeadGeneration;
    std::shared_ptr<T> object;
  };

  bool Decode(uint64_t handle, uint32_t* index, uint32_t* generation) const {
    if ((handle >> 56) != static_cast<uint64_t>(kind_)) return false;
    const uint32_t low = static_cast<uint32_t>(handle & 0xffffffffu);
    if (low == 0) return false;
    *index = low - 1;
    *generation = static_cast<uint32_t>((handle >> 32) & 0xffffff);
    return true;
  }

  const HandleKind kind_;
  mutable std::shared_mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace tern

#endif  // TERN_SRC_RUNTIME_HANDLE_TABLE_H_
