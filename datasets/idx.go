package datasets

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/leangrad/leangrad/fileio"
)

// FashionMNISTClasses names Fashion-MNIST's labels.
var FashionMNISTClasses = []string{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"}

// ParseIDX decodes an IDX file (the format of MNIST and Fashion-MNIST):
// magic 0x0000 08 D (unsigned bytes, D dimensions), D big-endian sizes, then
// the data. It returns the sizes and the data.
func ParseIDX(data []byte) (dims []int, body []byte, err error) {
	if len(data) < 4 {
		return nil, nil, fmt.Errorf("%d bytes: too short for an IDX header", len(data))
	}
	if data[0] != 0 || data[1] != 0 || data[2] != 0x08 {
		return nil, nil, fmt.Errorf("magic %02x%02x%02x%02x is not that of an IDX file of unsigned bytes", data[0], data[1], data[2], data[3])
	}
	nd := int(data[3])
	if nd < 1 || nd > 4 || len(data) < 4+4*nd {
		return nil, nil, fmt.Errorf("IDX header with %d dimensions is truncated or invalid", nd)
	}
	size := 1
	for i := 0; i < nd; i++ {
		d := binary.BigEndian.Uint32(data[4+4*i:])
		if d == 0 || d > 1<<28 || size > (1<<31)/int(d) {
			return nil, nil, fmt.Errorf("IDX dimension %d has an invalid size %d", i, d)
		}
		dims = append(dims, int(d))
		size *= int(d)
	}
	body = data[4+4*nd:]
	if len(body) != size {
		return nil, nil, fmt.Errorf("truncated or oversized: the header promises %v = %d bytes of data, the file has %d", dims, size, len(body))
	}
	return dims, body, nil
}

// idxHeaderMax is the most bytes an IDX header takes: its magic and 255
// dimensions.
const idxHeaderMax = 4 + 4*255

// readMaybeGzip reads a file, decompressing it when it starts with gzip's magic.
func readMaybeGzip(path string, limit int64) ([]byte, error) {
	raw, err := fileio.ReadFile(path, limit+idxHeaderMax) // its gzip or its raw bytes
	if err != nil {
		return nil, err
	}
	if len(raw) < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
		return raw, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: corrupt or truncated gzip data: %v", path, err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("%s: decompresses to more than %d bytes", path, limit)
	}
	return out, nil
}

// idxPath finds base or base.gz in dir.
func idxPath(dir, base string) (string, error) {
	for _, name := range []string{base + ".gz", base} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: no %s or %s.gz", dir, base, base)
}

// LoadIDX reads an images file (N×H×W) and its labels file (N) into a
// one-channel dataset of the given number of classes.
func LoadIDX(name, imagesPath, labelsPath string, classes int) (*Dataset, error) {
	const limit = 1 << 30
	raw, err := readMaybeGzip(imagesPath, limit)
	if err != nil {
		return nil, err
	}
	dims, pixels, err := ParseIDX(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", imagesPath, err)
	}
	if len(dims) != 3 {
		return nil, fmt.Errorf("%s: an images file has 3 dimensions (N, H, W), this one %v", imagesPath, dims)
	}
	raw, err = readMaybeGzip(labelsPath, limit)
	if err != nil {
		return nil, err
	}
	ldims, labels, err := ParseIDX(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", labelsPath, err)
	}
	if len(ldims) != 1 {
		return nil, fmt.Errorf("%s: a labels file has 1 dimension, this one %v", labelsPath, ldims)
	}
	if ldims[0] != dims[0] {
		return nil, fmt.Errorf("%s has %d labels but %s has %d images", labelsPath, ldims[0], imagesPath, dims[0])
	}
	d := &Dataset{Name: name, Images: pixels, N: dims[0], C: 1, H: dims[1], W: dims[2], Classes: classes}
	d.Labels = make([]int32, len(labels))
	for i, l := range labels {
		d.Labels[i] = int32(l)
	}
	if err := d.check(labelsPath); err != nil {
		return nil, err
	}
	return d, nil
}

// LoadFashionMNIST reads Fashion-MNIST's four IDX files (gzipped or not) from dir.
func LoadFashionMNIST(dir string) (train, test *Dataset, err error) {
	load := func(prefix string) (*Dataset, error) {
		ip, err := idxPath(dir, prefix+"-images-idx3-ubyte")
		if err != nil {
			return nil, err
		}
		lp, err := idxPath(dir, prefix+"-labels-idx1-ubyte")
		if err != nil {
			return nil, err
		}
		d, err := LoadIDX(FashionMNIST, ip, lp, 10)
		if d != nil {
			d.ClassNames = FashionMNISTClasses
		}
		return d, err
	}
	if train, err = load("train"); err != nil {
		return nil, nil, err
	}
	if test, err = load("t10k"); err != nil {
		return nil, nil, err
	}
	if train.H != test.H || train.W != test.W {
		return nil, nil, fmt.Errorf("%s: training images are %dx%d, test images %dx%d", dir, train.H, train.W, test.H, test.W)
	}
	return train, test, nil
}
