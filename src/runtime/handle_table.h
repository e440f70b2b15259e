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
#include <mutex>
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
  kIoSet = 8,
  kGraph = 9,
  kMemoryPool = 10,
};

// The most live objects of one kind a table holds (a handle's slot field is
// 32 bits; this bound keeps the chunk directory small).
inline constexpr uint32_t kMaxLiveHandles = 1u << 24;

// Next generation for any handle of any table in this process.
uint32_t NextHandleGeneration();

// Thread-safety: every method may be called concurrently.
//
// Slots live in chunks that never move once allocated, so Peek() can resolve
// a handle without a lock or a reference count (the queue calls on every
// submission and wait use it). Lookup() returns a counted reference for
// callers that keep the object beyond the call or must survive its
// concurrent destruction.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(HandleKind kind) : kind_(kind) {}
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;
  ~HandleTable() {
    for (auto& chunk : chunks_) delete[] chunk.load(std::memory_order_relaxed);
  }

  // Returns the new handle, or 0 when the table holds the most live objects
  // it can (kMaxLiveHandles). Tables of objects that are
  // bounded far below that (devices, cores, queues with a thread each,
  // communicators) do not check.
  uint64_t Insert(std::shared_ptr<T> object) {
    std::unique_lock lock(mutex_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (used_ == kMaxLiveHandles) return 0;
      index = used_++;
      std::atomic<Slot*>& chunk = chunks_[index / kChunkSlots];
      if (chunk.load(std::memory_order_relaxed) == nullptr) {
        chunk.store(new Slot[kChunkSlots], std::memory_order_release);
      }
    }
    Slot& slot = SlotAt(index);
    const uint32_t generation = NextHandleGeneration() & 0xffffff;
    slot.raw.store(object.get(), std::memory_order_relaxed);
    slot.object = std::move(object);
    // Publishes the slot to Peek().
    slot.generation.store(generation, std::memory_order_release);
    ++live_;
    return (static_cast<uint64_t>(kind_) << 56) | (static_cast<uint64_t>(generation) << 32) |
           (static_cast<uint64_t>(index) + 1);
  }

  // A counted reference to the object, or nullptr if the handle is not live.
  std::shared_ptr<T> Lookup(uint64_t handle) const {
    uint32_t index, generation;
    if (!Decode(handle, &index, &generation)) return nullptr;
    std::shared_lock lock(mutex_);
    if (index >= used_) return nullptr;
    const Slot& slot = SlotAt(index);
    if (slot.generation.load(std::memory_order_relaxed) != generation) return nullptr;
    return slot.object;
  }

  // The object, uncounted, or nullptr if the handle is not live. Valid until
  // the handle is removed: only for objects whose API forbids destroying
  // them while another thread uses them.
  T* Peek(uint64_t handle) const {
    uint32_t index, generation;
    if (!Decode(handle, &index, &generation)) return nullptr;
    if (index >= kMaxLiveHandles) return nullptr;
    const Slot* chunk = chunks_[index / kChunkSlots].load(std::memory_order_acquire);
    if (chunk == nullptr) return nullptr;
    const Slot& slot = chunk[index % kChunkSlots];
    if (slot.generation.load(std::memory_order_acquire) != generation) return nullptr;
    return slot.raw.load(std::memory_order_relaxed);
  }

  // Removes and returns the object, or nullptr if the handle is not live.
  std::shared_ptr<T> Remove(uint64_t handle) {
    uint32_t index, generation;
    if (!Decode(handle, &index, &generation)) return nullptr;
    std::unique_lock lock(mutex_);
    if (index >= used_) return nullptr;
    Slot& slot = SlotAt(index);
    if (slot.generation.load(std::memory_order_relaxed) != generation || !slot.object) {
      return nullptr;
    }
    slot.generation.store(kDeadGeneration, std::memory_order_release);
    slot.raw.store(nullptr, std::memory_order_relaxed);
    std::shared_ptr<T> object = std::move(slot.object);
    free_.push_back(index);
    --live_;
    return object;
  }

  // Removes every object (runtime shutdown), returning them.
  std::vector<std::shared_ptr<T>> Clear() {
    std::unique_lock lock(mutex_);
    std::vector<std::shared_ptr<T>> objects;
    for (uint32_t index = 0; index < used_; ++index) {
      Slot& slot = SlotAt(index);
      slot.generation.store(kDeadGeneration, std::memory_order_release);
      slot.raw.store(nullptr, std::memory_order_relaxed);
      if (slot.object) objects.push_back(std::move(slot.object));
    }
    // Slots stay allocated (Peek() may look at them); all of them are free.
    free_.clear();
    for (uint32_t index = used_; index > 0; --index) free_.push_back(index - 1);
    live_ = 0;
    return objects;
  }

  size_t live() const {
    std::shared_lock lock(mutex_);
    return live_;
  }

 private:
  static constexpr uint32_t kDeadGeneration = 0xffffffffu;  // never produced by Insert
  static constexpr uint32_t kChunkSlots = 1024;
  static constexpr uint32_t kChunkCount = kMaxLiveHandles / kChunkSlots;
  struct Slot {
    std::atomic<uint32_t> generation{kDeadGeneration};
    std::atomic<T*> raw{nullptr};  // object.get(), readable without the lock
    std::shared_ptr<T> object;     // guarded by mutex_
  };

  Slot& SlotAt(uint32_t index) const {
    return chunks_[index / kChunkSlots].load(std::memory_order_relaxed)[index % kChunkSlots];
  }

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
  // Chunks of slots, allocated on first use and kept until the table dies.
  std::atomic<Slot*> chunks_[kChunkCount] = {};
  uint32_t used_ = 0;  // guarded by mutex_: slots ever handed out
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace tern

#endif  // TERN_SRC_RUNTIME_HANDLE_TABLE_H_
