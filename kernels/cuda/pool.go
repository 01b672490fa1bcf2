package cuda

import "github.com/leangrad/leangrad/kernels"

// The pooling operations (kernels.PoolOps; pool.cu).

// poolArgs is the kernels' struct Pool.
type poolArgs struct{ N, C, H, W, KH, KW, SH, SW, PH, PW, OH, OW int32 }

type poolFwdArgs struct {
	P    poolArgs
	X, Y uintptr
}

type maxPoolBwdArgs struct {
	P         poolArgs
	X, Dy, Dx uintptr
}

type avgPoolBwdArgs struct {
	P      poolArgs
	Dy, Dx uintptr
}

var (
	kMaxPool    = declareTyped[poolFwdArgs]("maxpool")
	kMaxPoolBwd = declareTyped[maxPoolBwdArgs]("maxpool_bwd")
	kAvgPool    = declareTyped[poolFwdArgs]("avgpool")
	kAvgPoolBwd = declareTyped[avgPoolBwdArgs]("avgpool_bwd")
)

func toPool(p kernels.PoolParams) poolArgs {
	return poolArgs{int32(p.N), int32(p.C), int32(p.H), int32(p.W), int32(p.KH), int32(p.KW),
		int32(p.SH), int32(p.SW), int32(p.PH), int32(p.PW), int32(p.OutH()), int32(p.OutW())}
}

// MaxPool2d takes the maximum of each window.
func (b *Backend) MaxPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("max pool", p, x, y)
	s := floatType("max pool", x, y)
	b.enter()
	defer b.exit()
	kMaxPool.launch(b, s, b.elems(int64(y.N)), poolFwdArgs{toPool(p), ptrOf(x), ptrOf(y)})
}

// MaxPool2dBackward routes dy to each window's first maximum (a gather per input).
func (b *Backend) MaxPool2dBackward(p kernels.PoolParams, x, dy, dx kernels.Buf) {
	kernels.CheckPool("max pool backward", p, x, dy)
	kernels.CheckLen("max pool backward", x.N, dx)
	s := floatType("max pool backward", x, dy, dx)
	b.enter()
	defer b.exit()
	kMaxPoolBwd.launch(b, s, b.elems(int64(x.N)), maxPoolBwdArgs{toPool(p), ptrOf(x), ptrOf(dy), ptrOf(dx)})
}

// AvgPool2d averages each window.
func (b *Backend) AvgPool2d(p kernels.PoolParams, x, y kernels.Buf) {
	kernels.CheckPool("avg pool", p, x, y)
	s := floatType("avg pool", x, y)
	b.enter()
	defer b.exit()
	kAvgPool.launch(b, s, b.elems(int64(y.N)), poolFwdArgs{toPool(p), ptrOf(x), ptrOf(y)})
}

// AvgPool2dBackward spreads dy over the windows.
func (b *Backend) AvgPool2dBackward(p kernels.PoolParams, dy, dx kernels.Buf) {
	kernels.CheckPool("avg pool backward", p, dx, dy)
	s := floatType("avg pool backward", dy, dx)
	b.enter()
	defer b.exit()
	kAvgPoolBwd.launch(b, s, b.elems(int64(dx.N)), avgPoolBwdArgs{toPool(p), ptrOf(dy), ptrOf(dx)})
}
