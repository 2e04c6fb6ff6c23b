/* tests/bench_broken_reduce.c — a deliberately broken reduction, for tests only.
 *
 * Build: cc -shared -fPIC -o broken.so tests/bench_broken_reduce.c
 * Use:   LD_PRELOAD=$PWD/broken.so harp-bench allreduce ...
 *
 * base/reduce.cc looks this symbol up once (dlsym) and, when a process
 * defines it, calls it after every reduction kernel with the output. It flips
 * bit 6 of the most significant byte of the first element (for float32 an
 * exponent bit: 2.0 becomes ~4e-38 or 8.5e37), so every reduced buffer carries
 * one wrong value. tests/test_bench.py uses it to prove harp-bench catches it.
 */
#include <stddef.h>

void harp_test_reduce_hook(void* out, size_t n, size_t elem_size) {
  if (n == 0 || elem_size == 0) return;
  ((unsigned char*)out)[elem_size - 1] ^= 0x40;
}
