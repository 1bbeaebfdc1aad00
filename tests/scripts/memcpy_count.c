/* An LD_PRELOAD library for tests/scripts/inplace_probe.py: counts the memcpy calls of exactly
   MEMCPY_COUNT_BYTES bytes made through the dynamic linker (Horovod's library makes its calls
   that way), and among them those whose source is their destination. The probe reads both
   counts through memcpy_counts(). Copies with memmove, which handles any overlap. */
#include <stdlib.h>
#include <string.h>

static size_t counted_bytes;
static unsigned long copies, self_copies;

__attribute__((constructor)) static void read_size(void) {
  const char *bytes = getenv("MEMCPY_COUNT_BYTES");
  counted_bytes = bytes ? strtoul(bytes, NULL, 10) : 0;
}

void *memcpy(void *dst, const void *src, size_t n) {
  if (counted_bytes && n == counted_bytes) {
    __atomic_add_fetch(&copies, 1, __ATOMIC_RELAXED);
    if (dst == src) __atomic_add_fetch(&self_copies, 1, __ATOMIC_RELAXED);
  }
  return memmove(dst, src, n);
}

void memcpy_counts(unsigned long *all, unsigned long *self) {
  *all = __atomic_load_n(&copies, __ATOMIC_RELAXED);
  *self = __atomic_load_n(&self_copies, __ATOMIC_RELAXED);
}
