//go:build !sluice_mutation

package scriptcache

// traced is a no-op outside the mutation runner's test binaries (see
// trace_mutation.go); it inlines to nothing.
func traced(string) {}
