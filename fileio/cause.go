package fileio

import (
	"errors"
	"io/fs"
)

// Cause is err without the path that the message already names: a
// *fs.PathError's underlying error ("no such file or directory"), or err.
func Cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
