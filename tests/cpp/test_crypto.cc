// SHA-256 and HMAC-SHA256 against published vectors (FIPS 180-4 examples,
// RFC 4231), and the challenge-response's binding properties.
#include <gtest/gtest.h>

#include "bootstrap/crypto.h"

using namespace harp;

namespace {
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) {
    o += d[c >> 4];
    o += d[c & 15];
  }
  return o;
}
}  // namespace

TEST(Crypto, Sha256Vectors) {
  EXPECT_EQ(hex(crypto::sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(crypto::sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(crypto::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(crypto::sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Every length around the 55/56/64-byte padding boundaries hashes differently.
  std::string prev;
  for (size_t n = 50; n < 130; ++n) {
    std::string h = crypto::sha256(std::string(n, 'x'));
    EXPECT_NE(h, prev);
    prev = h;
  }
}

TEST(Crypto, HmacRfc4231) {
  EXPECT_EQ(hex(crypto::hmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(crypto::hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block size is hashed first.
  EXPECT_EQ(hex(crypto::hmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Crypto, ProofBindsKeyRoleNoncesAndContext) {
  std::string k = "k", na = crypto::nonce(), nb = crypto::nonce();
  EXPECT_EQ(na.size(), crypto::kNonceBytes);
  EXPECT_NE(na, nb);
  std::string p = crypto::proof(k, 'B', na, nb, "ctx");
  EXPECT_TRUE(crypto::equal(p, crypto::proof(k, 'B', na, nb, "ctx")));
  EXPECT_FALSE(crypto::equal(p, crypto::proof("k2", 'B', na, nb, "ctx")));
  EXPECT_FALSE(crypto::equal(p, crypto::proof(k, 'A', na, nb, "ctx")));
  EXPECT_FALSE(crypto::equal(p, crypto::proof(k, 'B', nb, na, "ctx")));
  EXPECT_FALSE(crypto::equal(p, crypto::proof(k, 'B', na, nb, "ctx2")));
  EXPECT_FALSE(crypto::equal(p, p.substr(0, 31)));
  EXPECT_NE(crypto::deriveKey("s", "store"), crypto::deriveKey("s", "data"));
}
