#pragma once
// Which GPU a thread works on. CUDA's current device is per thread and starts at device 0, so a
// thread that never sets it creates and uses a context on GPU 0: on an 8-GPU node every rank's
// helper thread (a communicator's watchdog freeing a finished op's buffers, say) then holds
// ~0.5 GiB of GPU 0, records events against another device's streams (which fails), and in
// EXCLUSIVE_PROCESS mode cannot run at all. On a one-GPU machine the mistake is invisible, so it is
// checked rather than observed: every thread that touches CUDA binds first (bindThreadToDevice),
// and the allocators, events and streams check the binding of the thread that calls them, on any
// machine.

#include <cstdint>
#include <string>

namespace mt {

// cudaSetDevice(device) for this thread, remembered for the checks below.
void bindThreadToDevice(int device);
// The device this thread bound to; -1 when it never bound.
int threadDevice();
// Throws InternalError naming `what` unless this thread is bound to `device` (-1: to any device).
void requireThreadDevice(int device, const char* what);
// The same for paths that cannot throw (frees, destructors): counts the violation, keeps its
// first message, and binds the thread to `device` (>= 0) so the call itself is right.
void noteThreadDevice(int device, const char* what) noexcept;
// Violations noted since the process started, and the first one's message (tests assert none).
int64_t threadDeviceViolations();
std::string firstThreadDeviceViolation();

}  // namespace mt
