package store

import (
	"fmt"
	"io"
)

// Probe is what a preflight learns about a store.
type Probe struct {
	Reachable   bool   `json:"reachable"`
	Writable    bool   `json:"writable"`
	IfNoneMatch bool   `json:"ifNoneMatch"` // create-if-absent is honoured
	IfMatch     bool   `json:"ifMatch"`     // compare-and-swap is honoured
	Error       string `json:"error,omitempty"`
}

// Safe reports whether the store honours both conditional writes.
func (p Probe) Safe() bool { return p.Reachable && p.Writable && p.IfNoneMatch && p.IfMatch }

// ReadAllLimited reads at most limit bytes of an object; more is an error.
func ReadAllLimited(r io.Reader, limit int64, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s is over the %d byte limit", ErrTooLarge, what, limit)
	}
	return data, nil
}
