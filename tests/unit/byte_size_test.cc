#include "common/byte_size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace tern {
namespace {

uint64_t Parsed(const std::string& text) {
  uint64_t value = 12345;
  Status status = ParseByteSize(text, &value);
  EXPECT_TRUE(status.ok()) << text << ": " << status.message();
  return value;
}

// The message of a refused text; the output is left alone.
std::string Refused(const std::string& text) {
  uint64_t value = 12345;
  Status status = ParseByteSize(text, &value);
  EXPECT_EQ(status.code(), TERN_ERROR_INVALID_ARGUMENT) << text;
  EXPECT_EQ(value, 12345u) << text;
  return status.message();
}

TEST(ByteSizeTest, PlainBytes) {
  EXPECT_EQ(Parsed("0"), 0u);
  EXPECT_EQ(Parsed("4096"), 4096u);
  EXPECT_EQ(Parsed("4096B"), 4096u);
  EXPECT_EQ(Parsed("4096b"), 4096u);
  EXPECT_EQ(Parsed("007"), 7u);
}

TEST(ByteSizeTest, BinarySuffixesInEitherCase) {
  EXPECT_EQ(Parsed("64K"), uint64_t{64} << 10);
  EXPECT_EQ(Parsed("64k"), uint64_t{64} << 10);
  EXPECT_EQ(Parsed("64KiB"), uint64_t{64} << 10);
  EXPECT_EQ(Parsed("64kib"), uint64_t{64} << 10);
  EXPECT_EQ(Parsed("16M"), uint64_t{16} << 20);
  EXPECT_EQ(Parsed("16MiB"), uint64_t{16} << 20);
  EXPECT_EQ(Parsed("8G"), uint64_t{8} << 30);
  EXPECT_EQ(Parsed("8g"), uint64_t{8} << 30);
  EXPECT_EQ(Parsed("8GIB"), uint64_t{8} << 30);
  EXPECT_EQ(Parsed("1T"), uint64_t{1} << 40);
  EXPECT_EQ(Parsed("1TiB"), uint64_t{1} << 40);
}

TEST(ByteSizeTest, Limits) {
  EXPECT_EQ(Parsed("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(Parsed("16777215T"), uint64_t{16777215} << 40);
  EXPECT_NE(Refused("18446744073709551616").find("more than 2^64 - 1 bytes"), std::string::npos);
  EXPECT_NE(Refused("16777216T").find("more than 2^64 - 1 bytes"), std::string::npos);
  EXPECT_NE(Refused("17179869184G").find("more than 2^64 - 1 bytes"), std::string::npos);
  EXPECT_NE(Refused("99999999999999999999999999K").find("more than"), std::string::npos);
}

TEST(ByteSizeTest, RefusesMalformedText) {
  EXPECT_EQ(Refused(""), "'' is not a byte size: it is empty");
  EXPECT_EQ(Refused("K"), "'K' is not a byte size: it does not start with a digit");
  EXPECT_EQ(Refused("-1"), "'-1' is not a byte size: it does not start with a digit");
  EXPECT_EQ(Refused("+1"), "'+1' is not a byte size: it does not start with a digit");
  EXPECT_EQ(Refused(" 1"), "' 1' is not a byte size: it does not start with a digit");
  EXPECT_NE(Refused("1 ").find("unknown suffix ' '"), std::string::npos);
  EXPECT_NE(Refused("12X").find("unknown suffix 'X'; write digits"), std::string::npos);
  EXPECT_NE(Refused("1KiBB").find("unknown suffix 'KiBB'"), std::string::npos);
  EXPECT_NE(Refused("1P").find("unknown suffix 'P'"), std::string::npos);
  EXPECT_NE(Refused("1.5G").find("fractions are not accepted"), std::string::npos);
}

TEST(ByteSizeTest, RefusesAmbiguousDecimalLookingSuffixes) {
  EXPECT_EQ(Refused("4KB"),
            "'4KB' is not a byte size: 'KB' is ambiguous (powers of 1000 or 1024?); write 'K' "
            "or 'KiB' for powers of 1024");
  EXPECT_NE(Refused("4mb").find("write 'M' or 'MiB'"), std::string::npos);
  EXPECT_NE(Refused("4GB").find("ambiguous"), std::string::npos);
  EXPECT_NE(Refused("4TB").find("ambiguous"), std::string::npos);
}

}  // namespace
}  // namespace tern
