// Macros shared by the AVX-512 passes (norm_amd64.s, elementwise_amd64.s).

// HSUM leaves the sum of z's sixteen lanes in its lowest (AVX-512F
// shuffles only), with tmp as scratch.
#define HSUM(z, tmp) \
	VSHUFF32X4 $0x4E, z, z, tmp; VADDPS tmp, z, z \
	VSHUFF32X4 $0xB1, z, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0x4E, z, tmp; VADDPS tmp, z, z \
	VPERMILPS $0xB1, z, tmp; VADDPS tmp, z, z

// TAILMASK sets K2 to the low n mod 16 bits, for n in CX, and CX to n/16:
// the whole vectors of n values and the tail's mask (R11, R12 scratch).
#define TAILMASK \
	MOVQ CX, R11; ANDQ $15, CX; MOVL $1, R12; SHLL CX, R12; DECL R12; KMOVW R12, K2; \
	MOVQ R11, CX; SHRQ $4, CX

// Loads and stores of sixteen values, whole or under K2 (zeros in the
// lanes a load leaves out), the bytes they span and log2 of a value's
// bytes: float32 ...
#define LOAD32(z, addr) VMOVUPS addr, z
#define MLOAD32(z, addr) VMOVUPS.Z addr, K2, z
#define STORE32(z, addr) VMOVUPS z, addr
#define MSTORE32(z, addr) VMOVUPS z, K2, addr
#define STEP32 64
#define LOG32 2

// ... and F16, through Y30.
#define LOAD16(z, addr) VCVTPH2PS addr, z
#define MLOAD16(z, addr) VMOVDQU16.Z addr, K2, Y30; VCVTPH2PS Y30, z
#define STORE16(z, addr) VCVTPS2PH $0, z, Y30; VMOVDQU16 Y30, addr
#define MSTORE16(z, addr) VCVTPS2PH $0, z, Y30; VMOVDQU16 Y30, K2, addr
#define STEP16 32
#define LOG16 1

