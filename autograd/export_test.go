package autograd

// SetFolding turns the folding of gradients (folder) on or off and returns
// what restores it: a test compares a graph's gradients and allocations
// with and without.
func SetFolding(on bool) (restore func()) {
	old := folding
	folding = on
	return func() { folding = old }
}
