import ctypes, struct, os, mmap
libc = ctypes.CDLL(None, use_errno=True)
SYS_bpf = 321
def create(vsize, entries, flags=1024, mtype=2):
    attr = struct.pack("IIIII", mtype, 4, vsize, entries, flags) + b"\0"*100
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(SYS_bpf, 0, buf, len(attr))
    return fd, ctypes.get_errno()
for vs, n in [(4<<20, 1), (4<<20, 1024), ((4<<20)+4096, 1), (8<<20,1), (1<<20, 4096)]:
    fd, e = create(vs, n)
    r = "fd" if fd >= 0 else os.strerror(e)
    if fd >= 0:
        try:
            m = mmap.mmap(fd, vs*n, mmap.MAP_SHARED, mmap.PROT_READ|mmap.PROT_WRITE)
            m[vs*n-1] = 7; r += " mmapped"; m.close()
        except Exception as ex: r += f" mmap failed {ex}"
        os.close(fd)
    print(vs, n, r)
fd, e = create(4096, 1, 1024, 33)
print("arena:", fd, os.strerror(e))
for vs, n in [(64<<20, 1), (512<<20, 1), (1<<30, 1), (2<<30,1), (1<<30, 4)]:
    fd, e = create(vs, n)
    r = "fd" if fd >= 0 else os.strerror(e)
    if fd >= 0: os.close(fd)
    print(vs>>20, "MiB x", n, r)
