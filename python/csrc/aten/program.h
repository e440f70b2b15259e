// Programs: how a native operator's computation becomes a tern executable,
// built with the builder API (include/tern/builder.h) the first time its key
// is seen, cached by key and run with tern_queue_execute() on the current
// stream's queue. (The simulator's engine kernels are another thing:
// driver_shim/sim/engines/kernels.h.)
//
// An operator describes its computation as a Program: it binds tensors as
// inputs and outputs, takes views of them (Operand: shape, strides and an
// offset in elements, all metadata), asks for scratch temporaries and
// constants, and emits instructions (docs/isa.md). Run() looks the program
// up by its key, builds and loads it the first time, and enqueues it:
//
//   program::Program p("aten::add.out");
//   auto a = p.In(self).Expand(out.sizes()), b = p.In(other).Expand(out.sizes());
//   p.Emit(TERN_OP_BINARY, {p.Out(out), a, b}, {TERN_BINARY_ADD});
//   if (!p.Run()) return <fallback>;
//
// Every tensor is bound through the range its elements span in its buffer
// (input/output i of the executable, declared as a 1-D tensor of that many
// elements), and instructions address it with its own sizes and strides:
// non-contiguous and broadcast (stride 0) tensors need no copies. The key is
// the op name, every binding's dtype and span, and every instruction with
// its operands, ints, floats and constants: one executable serves every call
// of that shape. Values that change from call to call without changing the
// program (optimizer step sizes, RNG positions) travel as Arg()s, packed into
// one small host-to-device copy per run, so they do not enter the key.
//
// Instructions on different engines are ordered with semaphores (each one
// waits for the one before it), so a program runs as written.
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "tern/builder.h"
#include "tern/executable.h"
#include "tern/isa.h"

namespace torch_tern::program {

// True when this libtern exports the builder and executable API and
// TORCH_TERN_KERNELS is not "0".
bool ExecutablesAvailable();

std::optional<tern_dtype_t> ToTernDtype(at::ScalarType type);
int64_t DtypeSize(tern_dtype_t dtype);

using Dims = c10::SmallVector<int64_t, 6>;

// A tensor in one of the program's segments; views are metadata only.
struct Operand {
  tern_segment_t segment = TERN_SEGMENT_NONE;
  uint32_t index = 0;
  int64_t offset = 0;  // elements from the start of the segment
  tern_dtype_t dtype = TERN_DTYPE_F32;
  Dims shape;
  Dims strides;

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  bool present() const { return segment != TERN_SEGMENT_NONE; }
  bool IsContiguous() const;

  // numpy broadcasting to `shape` (new leading dims and size-1 dims get stride 0).
  Operand Expand(c10::IntArrayRef shape) const;
  // Another shape over the same elements (as Tensor.view); throws if the
  // strides cannot express it.
  Operand View(c10::IntArrayRef shape) const;
  Operand Permute(c10::IntArrayRef dims) const;
  Operand Transpose(int64_t a, int64_t b) const;
  Operand Slice(int64_t dim, int64_t start, int64_t length, int64_t step = 1) const;
  Operand Select(int64_t dim, int64_t index) const;
  Operand Unsqueeze(int64_t dim) const;
  // Re-labels the elements with another dtype of the same size (bits unchanged).
  Operand Reinterpret(tern_dtype_t dtype) const;
};

// An absent optional operand.
Operand None();

// Steps of an ELEMENTWISE program (Program::EmitFused): registers 0.. hold
// its inputs, step k's result is register kFirstStep + k.
inline constexpr int64_t kFirstStep = TERN_PROGRAM_INPUTS;
inline std::array<int64_t, 5> BinaryStep(tern_binary_fn_t fn, int64_t a, int64_t b) {
  return {TERN_STEP_BINARY, fn, a, b, 0};
}

// The key under which RunElementwise finds its programs (program.cc).
struct ElementwiseKey;
// How RunElementwise's run-time scalar enters its program (see there).
enum class ElementwiseScalar : int8_t { kNone, kLastOperand, kScalesLastInput };

class Program {
 public:
  explicit Program(std::string name);
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const std::string& name() const { return name_; }

  // Binds a tern tensor as an input / an output; the operand has the tensor's
  // sizes and strides. Binding the same range twice reuses the binding.
  Operand In(const at::Tensor& t);
  Operand Out(const at::Tensor& t);
  // Binds `elements` elements of `dtype` at byte `offset` of a tern buffer
  // the plugin manages itself (e.g. the RNG pools); a 1-D operand. Only the
  // element count enters the key, so the offset can change from run to run.
  // The device of a program that binds only raw buffers.
  void SetDevice(c10::DeviceIndex device);
  Operand InRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype, int64_t elements);
  Operand OutRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype, int64_t elements);
  // A contiguous temporary in the program's scratch memory.
  Operand Temp(tern_dtype_t dtype, c10::IntArrayRef shape);
  // A rank-0 constant of the executable (its value is part of the key).
  Operand Const(double value, tern_dtype_t dtype);
  Operand ConstInt(int64_t value, tern_dtype_t dtype);
  // A rank-0 value passed at run time (not part of the key).
  Operand Arg(double value, tern_dtype_t dtype);
  Operand ArgInt(int64_t value, tern_dtype_t dtype);

  void Emit(tern_opcode_t opcode, std::vector<Operand> operands, std::vector<int64_t> ints = {},
            std::vector<double> floats = {});
  // out = the last of `steps` over `inputs` (registers 0..; step k's result
  // is register kFirstStep + k), as one ELEMENTWISE instruction.
  // Each step rounds to f32 as an instruction of its own would, so an f32
  // chain of BINARY / WHERE instructions through scratch gives the same bits
  // in one pass and without the scratch. Steps are {kind, fn, a, b, c}.
  void EmitFused(Operand out, std::vector<Operand> inputs,
                 const std::vector<std::array<int64_t, 5>>& steps);

  // False when a tensor cannot be bound (not on one tern device, a dtype tern
  // lacks, rank > 8, conj/neg bit).
  bool ok() const { return ok_; }
  // Lets float64 tensors bind (TERN_DTYPE_F64). The ISA takes f64 in copies,
  // casts, fills, where and a few exact Vector functions only (docs/isa.md),
  // so only kernels that emit nothing else call this; elsewhere a float64
  // tensor does not bind and the kernel declines.
  void AllowF64() { allow_f64_ = true; }
  // Builds (first run of a key) and enqueues the program. Returns false,
  // having queued nothing, when it cannot run natively (see ok(), or the
  // builder/loader refused it: the reason is kept in GetCacheInfo()); the
  // caller then takes its fallback path. `cache` false builds a one-off
  // executable that is unloaded once queued.
  bool Run(bool cache = true);

  struct Binding {
    bool is_tensor;  // false for the args blob and raw buffers
    bool output;
    tern_dtype_t dtype;
    int64_t span;
    tern_buffer_t raw_buffer = nullptr;
    uint64_t raw_offset = 0;
    // A bound tensor's first element, and its storage, which keeps that
    // memory alive until the run is queued (a temporary's too). The storage,
    // not the tensor: copying a tensor that Python holds takes the GIL
    // (PyTorch keeps its Python object alive), once per binding per op.
    const void* data = nullptr;
    c10::Storage storage;
  };
  struct Instruction {
    tern_opcode_t opcode;
    std::vector<Operand> operands;
    std::vector<int64_t> ints;
    std::vector<double> floats;
  };

 private:
  Operand Bind(const at::Tensor& t, bool output);
  Operand BindRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype, int64_t elements,
                  bool output);
  Operand AddConstant(const void* bytes, tern_dtype_t dtype);
  Operand AddArg(const void* bytes, tern_dtype_t dtype);
  friend bool RunElementwise(const char*, tern_opcode_t, int64_t, const at::Tensor&,
                             std::initializer_list<at::Tensor>, ElementwiseScalar, double,
                             void (*)(Program&, const std::vector<Operand>&, int64_t));

  std::string name_;
  // Set by RunElementwise: Run() also files the executable under this key.
  const ElementwiseKey* elementwise_key_ = nullptr;
  bool ok_ = true;
  bool allow_f64_ = false;
  c10::Device device_{c10::DeviceType::PrivateUse1, -1};
  std::vector<Binding> bindings_;  // inputs and outputs in binding order
  uint32_t inputs_ = 0;
  uint32_t outputs_ = 0;
  int64_t scratch_bytes_ = 0;
  std::vector<uint8_t> constants_;
  std::vector<uint8_t> args_;
  int32_t args_input_ = -1;  // input index of the args blob
  std::vector<Instruction> instructions_;
};

// One instruction over whole tensors (outputs first in the operand list).
bool LaunchSingleOp(const std::string& op, tern_opcode_t opcode,
                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    const std::vector<int64_t>& ints, const std::vector<double>& floats);

// The commonest eager call, run without building a Program or its key:
// `opcode` with the one int `fn` over whole tensors of one dtype, shape and
// device, all contiguous (`out` may be one of `inputs`, in place; at most
// three inputs), such as `a + b` or `x.relu()` without broadcasting, casts or
// scalars, except that an input may be one element (0-dim) broadcast to out
// (`g.mul_(clip_coef)`). The program is 1-D over the element count, found by a compact key
// (name, opcode, fn, dtype, device, count, which inputs are the same tensor);
// the first call of a key builds it through Run(). False, having queued
// nothing, where the call does not fit or the program was refused: the
// caller then takes its general path. `name` must be a string literal (its
// address is part of the key).
// With a scalar, a value of out's dtype passed at run time (Arg; its value
// is not part of the key) is either the instruction's last operand
// (`x * 0.9`, an optimizer's `p.mul_(beta)`) or the factor the last input is
// multiplied by first (`torch.add(a, b, alpha=-lr)`: two instructions).
// With `emit`, the first call's program is not the one instruction `opcode`
// but whatever emit(p, operands, fn) writes, `operands` being the 1-D out,
// inputs and scalar (kLastOperand), in that order: an op of a few
// instructions (addcmul, lerp) whose program depends on nothing else than
// `name` and `fn` (both in the key). `opcode` is then unused.
// Thread-safety: any thread.
using ElementwiseEmitter = void (*)(Program& p, const std::vector<Operand>& operands, int64_t fn);
bool RunElementwise(const char* name, tern_opcode_t opcode, int64_t fn, const at::Tensor& out,
                    std::initializer_list<at::Tensor> inputs,
                    ElementwiseScalar scalar_use = ElementwiseScalar::kNone, double scalar = 0.0,
                    ElementwiseEmitter emit = nullptr);

// Device-to-device copy of any layout and dtype (TERN_OP_COPY / TERN_OP_CAST).
bool TryCopyKernel(const at::Tensor& src, const at::Tensor& dst);

struct CacheInfo {
  bool executables_available = false;
  int64_t entries = 0;  // executables loaded (cached)
  int64_t hits = 0;
  int64_t misses = 0;    // builds attempted
  int64_t failures = 0;  // builds or loads refused (cached: not retried)
  int64_t evictions = 0;
  int64_t launches = 0;
  std::string last_error;
};
CacheInfo GetCacheInfo();
// Drops every cached executable: unloaded now, or by the last run that was
// between its lookup and its submission (see SubmitWindow in program.cc).
void ClearCache();

}  // namespace torch_tern::program
