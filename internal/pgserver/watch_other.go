//go:build !unix

package pgserver

// watch does nothing where there is no /bin/sh: call Stop.
func (c *Cluster) watch() error { return nil }
