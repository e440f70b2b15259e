// Reading FlatBuffers vectors of 8-byte scalars safely. The FlatBuffers
// verifier checks the alignment of a vector's length field (4 bytes) but not
// of its elements, so in a hostile buffer a vector of longs or doubles may be
// misaligned: these helpers copy the bytes instead of loading through a
// misaligned pointer.
#ifndef TERN_SRC_EXECUTABLE_FB_UTIL_H_
#define TERN_SRC_EXECUTABLE_FB_UTIL_H_

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace tern::exe {

template <typename T>
T ScalarAt(const flatbuffers::Vector<T>* vector, uint32_t index) {
  T value;
  std::memcpy(&value, vector->Data() + size_t{index} * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void CopyScalars(const flatbuffers::Vector<T>* vector, T* out) {
  if (vector != nullptr && vector->size() > 0) {
    std::memcpy(out, vector->Data(), size_t{vector->size()} * sizeof(T));
  }
}

template <typename T>
void CopyScalars(const flatbuffers::Vector<T>* vector, std::vector<T>* out) {
  out->resize(vector == nullptr ? 0 : vector->size());
  CopyScalars(vector, out->data());
}

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_FB_UTIL_H_
