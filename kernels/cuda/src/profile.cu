// spin keeps its one thread busy for ns nanoseconds of the GPU's global
// timer: queued first, it lets the host queue work ahead of the device, so
// that a profile measures device time without host gaps.
extern "C" __global__ void spin(long long ns) {
    kernel_entry();
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(10000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while ((long long)(now - start) < ns);
}
