package fileio

import (
	"errors"
	"io/fs"
)

// Cause is err without the path that the message already names: a
// *fs.PathError's underlying error ("no such file or directory"), a
// *NotRegularError's kind ("a FIFO, not a regular file"), or err.
func Cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var nr *NotRegularError
	if errors.As(err, &nr) {
		return errors.New(nr.Kind + ", not a regular file")
	}
	return err
}
