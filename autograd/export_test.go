package autograd

// SetFolding turns the folding of gradients (folder) on or off and returns
// what restores it: a test compares a graph's gradients and allocations
// with and without.
func SetFolding(on bool) (restore func()) {
	old := folding
	folding = on
	return func() { folding = old }
}

// SetRounding turns on or off the roundings a folder writes for a product's
// backward (Note [a gradient rounded where it is finished]) and returns
// what restores it.
func SetRounding(on bool) (restore func()) {
	old := rounding
	rounding = on
	return func() { rounding = old }
}
