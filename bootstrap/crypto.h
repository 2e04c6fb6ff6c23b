// bootstrap/crypto.h — SHA-256, HMAC-SHA256 and the mutual challenge-response that
// every HARP connection (bootstrap store, every data-plane transport) runs
// before it trusts a peer.
//
// Usage (one side each; `key` is the job secret or a key derived from it,
// `context` binds the handshake to what is being joined, e.g. "tcp|<comm id>"):
//
//   // connector (A)                          // acceptor (B)
//   std::string na = crypto::nonce();
//   send(na)                            ->    std::string na = recv(32);
//                                             std::string nb = crypto::nonce();
//                                       <-    send(nb + crypto::proof(key, 'B', na, nb, context))
//   check crypto::equal(recv_mac,
//        crypto::proof(key, 'B', na, nb, context))
//   send(crypto::proof(key, 'A', nb, na, context))  ->
//                                             check crypto::equal(mac, crypto::proof(key, 'A', nb, na, context))
//
// Each side proves knowledge of `key` over a nonce chosen by the other side,
// so a recorded handshake cannot be replayed and the key never travels. The
// role byte keeps one side's proof from being reflected back as the other's.
//
// Lifetime and threading: pure functions, thread-safe, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace harp::crypto {

constexpr size_t kDigestBytes = 32;  // SHA-256 output, HMAC output
constexpr size_t kNonceBytes = 32;

// SHA-256 of n bytes (FIPS 180-4). Returns 32 raw bytes.
std::string sha256(const void* data, size_t n);
inline std::string sha256(const std::string& s) { return sha256(s.data(), s.size()); }

// HMAC-SHA256 (RFC 2104). Returns 32 raw bytes.
std::string hmacSha256(const std::string& key, const std::string& msg);

// Constant-time comparison (time depends only on the lengths).
bool equal(const std::string& a, const std::string& b);

// kNonceBytes from the kernel's CSPRNG (getrandom).
std::string nonce();

// A party's proof in the challenge-response above: HMAC(key, "HARP-AUTH1" |
// role | challenge | own_nonce | context). `role` is 'A' (connector) or 'B'
// (acceptor); `challenge` is the nonce the other party sent.
std::string proof(const std::string& key, char role, const std::string& challenge, const std::string& own_nonce,
                  const std::string& context);

// A key for one purpose derived from the job secret (HMAC(secret, label)), so
// that e.g. the store and the data plane never share a key.
std::string deriveKey(const std::string& secret, const std::string& label);

}  // namespace harp::crypto
