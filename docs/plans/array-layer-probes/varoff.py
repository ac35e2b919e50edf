# Does the verifier (this host's 6.18) accept a masked variable offset into one element of an
# mmapable array map of value size B? A syscall program: r6 = ctx u32 word; mask; lookup key 0;
# load 8 bytes at elem + (r6 & (B-8)); return it.
import ctypes, struct, os
libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, len(attr))
    r = libc.syscall(321, cmd, buf, len(attr))
    return r, ctypes.get_errno(), buf
def map_create(vs):
    r, e, _ = bpf(0, struct.pack("IIIII", 2, 4, vs, 1, 1024) + b"\0"*100)
    return r, e
def ins(op, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)
def prog(fd, mask):
    p = b""
    p += ins(0x61, 6, 1, 0, 0)            # r6 = *(u32 *)(r1 + 0)
    p += ins(0x57, 6, 0, 0, mask)         # r6 &= mask   (imm is s32: masks < 2^31)
    p += ins(0x62, 10, 0, -4, 0)          # *(u32 *)(r10 - 4) = 0
    p += ins(0xbf, 2, 10)                 # r2 = r10
    p += ins(0x07, 2, 0, 0, -4)           # r2 += -4
    p += ins(0x18, 1, 1, 0, fd) + ins(0, 0, 0, 0, 0)  # r1 = map fd (ld_imm64 pseudo)
    p += ins(0x85, 0, 0, 0, 1)            # call bpf_map_lookup_elem
    p += ins(0x55, 0, 0, 2, 0)            # if r0 != 0 goto +2
    p += ins(0xb7, 0, 0, 0, 0)            # r0 = 0
    p += ins(0x95)                        # exit
    p += ins(0x0f, 0, 6)                  # r0 += r6
    p += ins(0x79, 0, 0, 0, 0)            # r0 = *(u64 *)(r0 + 0)
    p += ins(0x95)                        # exit
    return p
log = ctypes.create_string_buffer(1 << 16)
lic = ctypes.create_string_buffer(b"GPL")
for B in [4 << 20, 256 << 20, 512 << 20, 1 << 30]:
    fd, e = map_create(B)
    if fd < 0:
        print(B >> 20, "MiB: map", os.strerror(e)); continue
    code = prog(fd, B - 8)
    cbuf = ctypes.create_string_buffer(code, len(code))
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags
    attr = struct.pack("<IIQQIIQII", 31, len(code) // 8, ctypes.addressof(cbuf), ctypes.addressof(lic),
                       1, len(log), ctypes.addressof(log), 0, 16)
    attr += b"\0" * (144 - len(attr))
    r, e, _ = bpf(5, attr)
    msg = log.value.decode(errors="replace").strip().splitlines()
    print(B >> 20, "MiB:", "loaded" if r >= 0 else f"refused ({os.strerror(e)}): " + " | ".join(msg[-2:]))
    if r >= 0: os.close(r)
    os.close(fd)
