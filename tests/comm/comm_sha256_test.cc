// The SHA-256 and HMAC-SHA-256 that authenticate communicators
// (collectives/sha256.h), against the published test vectors: FIPS 180-4's
// examples and RFC 4231's HMAC test cases.
#include <gtest/gtest.h>

#include <string>

#include "collectives/sha256.h"

namespace tern::comm {
namespace {

std::string Hex(const Sha256Digest& digest) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text;
  for (uint8_t b : digest) {
    text += kDigits[b >> 4];
    text += kDigits[b & 15];
  }
  return text;
}

TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", Hex(Sha256Of("")));
  EXPECT_EQ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            Hex(Sha256Of("abc")));
  EXPECT_EQ("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            Hex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")));
  EXPECT_EQ("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
            Hex(Sha256Of(std::string(1000000, 'a'))));
}

// Fed in pieces of every size, across block boundaries: the same digest.
TEST(Sha256Test, IncrementalMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 300; ++i) data += static_cast<char>(i * 7 + 3);
  const Sha256Digest whole = Sha256Of(data);
  for (size_t piece = 1; piece <= 130; ++piece) {
    Sha256 hash;
    for (size_t at = 0; at < data.size(); at += piece) {
      hash.Update(std::string_view(data).substr(at, piece));
    }
    EXPECT_EQ(Hex(whole), Hex(hash.Finish())) << "pieces of " << piece;
  }
}

TEST(Sha256Test, HmacRfc4231) {
  EXPECT_EQ("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")));
  EXPECT_EQ("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            Hex(HmacSha256("Jefe", "what do ya want for nothing?")));
  EXPECT_EQ("773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))));
  // A key longer than a block is hashed first.
  EXPECT_EQ("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            Hex(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")));
}

TEST(Sha256Test, ConstantTimeEqual) {
  const std::string a = "0123456789abcdef", b = "0123456789abcdeF";
  EXPECT_TRUE(ConstantTimeEqual(a.data(), a.data(), a.size()));
  EXPECT_FALSE(ConstantTimeEqual(a.data(), b.data(), a.size()));
  EXPECT_TRUE(ConstantTimeEqual(a.data(), b.data(), a.size() - 1));
}

}  // namespace
}  // namespace tern::comm
