package datasets

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/leangrad/leangrad/fileio"
)

// CIFAR10Classes names CIFAR-10's labels.
var CIFAR10Classes = []string{"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}

const cifarRecord = 1 + 3*32*32

// cifarBatchMax is the size of a CIFAR-10 batch file: 10,000 records.
const cifarBatchMax = 10000 * cifarRecord

// ParseCIFAR decodes one CIFAR-10 binary batch: records of a label byte and
// 3×32×32 pixel bytes (the red plane, then green, then blue).
func ParseCIFAR(data []byte) (*Dataset, error) {
	if len(data) == 0 || len(data)%cifarRecord != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of %d-byte records (truncated?)", len(data), cifarRecord)
	}
	n := len(data) / cifarRecord
	d := &Dataset{Name: CIFAR10, N: n, C: 3, H: 32, W: 32, Classes: 10, ClassNames: CIFAR10Classes,
		Images: make([]uint8, 0, n*3072), Labels: make([]int32, n)}
	for i := 0; i < n; i++ {
		rec := data[i*cifarRecord : (i+1)*cifarRecord]
		if rec[0] > 9 {
			return nil, fmt.Errorf("record %d has label %d, outside 0..9", i, rec[0])
		}
		d.Labels[i] = int32(rec[0])
		d.Images = append(d.Images, rec[1:]...)
	}
	return d, nil
}

func cifarDir(dir string) (string, error) {
	for _, d := range []string{dir, filepath.Join(dir, "cifar-10-batches-bin")} {
		if _, err := os.Stat(filepath.Join(d, "data_batch_1.bin")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s: no data_batch_1.bin (nor in cifar-10-batches-bin/)", dir)
}

// LoadCIFAR10 reads data_batch_1..5.bin and test_batch.bin from dir (or its
// cifar-10-batches-bin folder).
func LoadCIFAR10(dir string) (train, test *Dataset, err error) {
	dir, err = cifarDir(dir)
	if err != nil {
		return nil, nil, err
	}
	read := func(files ...string) (*Dataset, error) {
		var all *Dataset
		for _, f := range files {
			p := filepath.Join(dir, f)
			data, err := fileio.ReadFile(p, cifarBatchMax)
			if err != nil {
				return nil, err
			}
			d, err := ParseCIFAR(data)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", p, err)
			}
			if all == nil {
				all = d
				continue
			}
			all.Images = append(all.Images, d.Images...)
			all.Labels = append(all.Labels, d.Labels...)
			all.N += d.N
		}
		return all, nil
	}
	if train, err = read("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"); err != nil {
		return nil, nil, err
	}
	if test, err = read("test_batch.bin"); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}
