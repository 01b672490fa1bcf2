package tensor

import (
	"errors"
	"runtime"
)

// Catch runs f and returns the error an operation inside it raised because
// the device could not do it: an *memory.OOMError when the pool could not
// provide memory, a driver error from the CUDA backend. Operations report
// those by panicking with the error (an operation has no error result);
// Catch is where a caller turns them back into a value, as train.Step does
// for every step. Everything f made in scopes is released as the panic
// unwinds them. Programmer errors (panics with strings, runtime errors)
// are not caught: they keep panicking.
func Catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = AsError(r)
		}
	}()
	f()
	return nil
}

// AsError is the error a recovered panic value carries, for code that
// recovers itself (see Catch); it panics again with anything else.
func AsError(r any) error {
	e, ok := r.(error)
	var rt runtime.Error
	if !ok || errors.As(e, &rt) {
		panic(r)
	}
	return e
}
