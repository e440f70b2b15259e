// Orders the engine streams of one function with as few semaphores and sync
// instructions as the data dependencies allow.
//
// Instructions arrive in program order, each on its engine with the byte
// ranges it reads and writes. Two accesses conflict when they overlap and one
// writes (read-after-write, write-after-read, write-after-write); a conflict
// with an instruction of another engine needs that instruction to have
// signalled and this engine to wait for it, unless an earlier wait already
// ordered it (vector clocks carry that knowledge through third engines).
// Each engine signals one semaphore of its own, numbered after the engine,
// by 1 per signal: the n-th signal of engine F makes semaphore F reach n,
// and a wait for n is ordered after exactly that signal. Signals are added
// lazily, when a later instruction first needs one, and then cover every
// instruction the engine has so far.
#ifndef TERN_COMPILER_LOWER_ENGINE_SYNC_H_
#define TERN_COMPILER_LOWER_ENGINE_SYNC_H_

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "compiler/lower/tensor_ref.h"
#include "tern/isa.h"

namespace tern::compiler {

// One operand's bytes: which memory (a segment and its index) and where.
struct MemoryAccess {
  uint64_t memory = 0;  // (segment << 32) | index; inputs and constants need no tracking
  ByteExtent extent;
  bool write = false;
};

// A sync instruction to add (builder form: the engine is the stream).
struct SyncInstruction {
  tern_opcode_t opcode = TERN_OP_SEM_WAIT;
  tern_engine_t engine = TERN_ENGINE_DMA;  // the stream it goes into
  uint32_t semaphore = 0;
  uint64_t value = 0;  // the increment of a signal, the value a wait waits for
};

class EngineSynchronizer {
 public:
  // Returns the sync instructions to add, in order, just before an
  // instruction on `engine` with these accesses (signals into other
  // engines' streams, then waits into this one), and records it as added.
  // Thread-safety: not concurrently on one object.
  std::vector<SyncInstruction> Add(tern_engine_t engine, const std::vector<MemoryAccess>& accesses);

  // Semaphores used so far (one per engine that signalled).
  uint32_t semaphores_used() const;

 private:
  static constexpr size_t kEngines = 8;  // indexed by tern_engine_t
  using Clock = std::array<uint64_t, kEngines>;
  struct Signal {
    uint64_t covers = 0;  // the engine's instructions up to this one are done
    Clock clock{};        // what the engine knew when it signalled
  };
  struct Record {
    ByteExtent extent;
    uint8_t engine = 0;
    uint64_t sequence = 0;  // position in the engine's stream, from 1
    bool write = false;
  };

  std::array<uint64_t, kEngines> count_{};
  std::array<Clock, kEngines> clock_{};
  std::array<std::vector<Signal>, kEngines> signals_;
  std::map<uint64_t, std::vector<Record>> records_;  // by memory
};

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_ENGINE_SYNC_H_
