package main

import (
	"fmt"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/dist"
)

// jobPlace is this process's place in a data-parallel job (nil: none),
// checked against the flags.
func jobPlace(o *options) (*dist.Config, error) {
	cfg, ok, err := cmdenv.Job()
	if !ok {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("data-parallel job: %w", err)
	}
	if o.nproc > 1 {
		return nil, fmt.Errorf("-nproc %d inside a job that was already launched (WORLD_SIZE=%d)", o.nproc, cfg.Size)
	}
	cfg.Timeout = o.distTimeout
	return &cfg, nil
}
