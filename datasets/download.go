package datasets

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/leangrad/leangrad/fileio"
)

// FashionMNISTURL is where DownloadFashionMNIST fetches the files from.
var FashionMNISTURL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

// fashionMNISTFiles are the canonical files and the SHA-256 of their
// decompressed content (the .gz wrappers differ between mirrors, the data
// does not).
var fashionMNISTFiles = map[string]string{
	"train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
	"train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
	"t10k-images-idx3-ubyte.gz":  "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
	"t10k-labels-idx1-ubyte.gz":  "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}

// DownloadFashionMNIST fetches the four Fashion-MNIST files into dir,
// verifying each one's decompressed content against its known SHA-256
// before it is written (atomically).
func DownloadFashionMNIST(dir string) error {
	client := &http.Client{Timeout: 5 * time.Minute}
	for name, sum := range fashionMNISTFiles {
		url := FashionMNISTURL + name
		resp, err := client.Get(url)
		if err != nil {
			return fmt.Errorf("downloading %s: %w", url, err)
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, 100<<20))
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("downloading %s: %w", url, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("downloading %s: %s", url, resp.Status)
		}
		if err := verifyGzipSHA256(data, sum); err != nil {
			return fmt.Errorf("%s: %w", url, err)
		}
		if err := fileio.WriteFile(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}

func verifyGzipSHA256(data []byte, want string) error {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not gzip data: %v", err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(zr, 1<<30)); err != nil {
		return fmt.Errorf("corrupt gzip data: %v", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("checksum mismatch: content SHA-256 %s, want %s", got, want)
	}
	return nil
}
