/* A shared library for mt-agent's tests: a trigger in a library, a name
 * also defined by the executable (ambiguity), two versions of one symbol,
 * and a GNU indirect function. */
#include <stdint.h>

volatile uint64_t lib_sink;

__attribute__((noinline, visibility("default"))) void lib_trigger(long i) { lib_sink += (uint64_t)i; }

/* Also defined in libuser.c: an ambiguous name across two objects. */
__attribute__((noinline, visibility("default"))) void common_name(long i) { lib_sink += (uint64_t)i * 3; }

/* Two versions of one function (see libtrig.map). */
__attribute__((noinline)) long versioned_v1(long i) { return i + 1; }
__attribute__((noinline)) long versioned_v2(long i) { return i + 2; }
__asm__(".symver versioned_v1, versioned@V1");
__asm__(".symver versioned_v2, versioned@@V2");

/* An IFUNC whose resolver picks one of two implementations. */
__attribute__((noinline)) long lib_pick_generic(long i) { return i; }
__attribute__((noinline)) long lib_pick_fast(long i) { return i + 0; }
static long (*resolve_pick(void))(long) { return lib_pick_fast; }
long lib_pick(long) __attribute__((ifunc("resolve_pick")));
