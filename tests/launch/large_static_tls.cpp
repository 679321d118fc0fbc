// Linked into test_metrics_server_tls with test_metrics_server.cpp: gives that binary 256 KiB of
// static TLS, more than a CUDA-linked meshtrain carries (~170 KiB: libcublasLt, OpenBLAS, NCCL,
// cudart), so the server tests there run under the condition that kept civetweb from starting in
// every CUDA build: glibc refuses (EINVAL) a thread whose requested stack is smaller than the
// static TLS it must hold, and civetweb's stack size was fixed at build time (~100 KiB).
#include <gtest/gtest.h>

#include <pthread.h>

#include <cerrno>

namespace mt {

// The executable's TLS block is static TLS. External linkage, so the compiler cannot drop it as
// written-only (it did, in an anonymous namespace).
extern thread_local char tLargeStaticTlsPad[256 << 10];
thread_local char tLargeStaticTlsPad[256 << 10];

namespace {

void* touchPad(void*) {
  tLargeStaticTlsPad[0] = 1;
  return nullptr;
}

// The condition itself: without it, the server tests in this binary would prove nothing.
TEST(LargeStaticTls, ThreadsWithSmallStacksAreRefused) {
  tLargeStaticTlsPad[0] = 1;
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 128 << 10), 0);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, &touchPad, nullptr);
  if (rc == 0) pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(rc, EINVAL) << "a 128 KiB stack was accepted: the static TLS is not as large as intended";
}

}  // namespace
}  // namespace mt
