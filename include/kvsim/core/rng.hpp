// kvsim: seeded random engines. Every random choice in kvsim comes from a Boost.Random engine whose
// seed is derived from (config seed, layer, head, policy index, trial, stream tag) by a fixed
// mixing function, so results are reproducible and independent of thread scheduling.
#pragma once
#include <boost/random/mersenne_twister.hpp>
#include <cstdint>
#include <initializer_list>

namespace kvsim {

using Engine = boost::random::mt19937_64;

/// SplitMix64 finalizer: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Derive a seed from a list of integers (order matters).
inline uint64_t derive_seed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t p : parts) h = mix64(h ^ mix64(p));
  return h;
}

inline Engine make_engine(std::initializer_list<uint64_t> parts) { return Engine(derive_seed(parts)); }

}  // namespace kvsim
