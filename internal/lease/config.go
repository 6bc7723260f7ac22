package lease

import (
	"fmt"
	"time"
)

// Bounds and defaults of the lease settings mutex and semaphore share.
const (
	MinLease              = 30 * time.Millisecond
	MaxLease              = 365 * 24 * time.Hour // its milliseconds fit everywhere they go
	DefaultWatchdogLease  = 30 * time.Second
	DefaultReplicaTimeout = 100 * time.Millisecond
	maxReplicaAcks        = 100
	maxReplicaTimeout     = time.Minute
)

// Config holds the lease settings of a primitive's Options; the primitives
// document each field for their users.
type Config struct {
	Fixed          time.Duration // fixed lease, not renewed; 0: watchdog
	Watchdog       time.Duration // lease the watchdog renews; 0: default
	ReplicaAcks    int           // replicas that must confirm a grant; 0: none
	ReplicaTimeout time.Duration // bound of that wait; 0: default
}

// Normalize fills in defaults and checks ranges. Its errors have no package
// prefix: callers wrap them in their own ErrInvalidOptions.
func (c *Config) Normalize() error {
	if c.Watchdog == 0 {
		c.Watchdog = DefaultWatchdogLease
	}
	if c.ReplicaTimeout == 0 {
		c.ReplicaTimeout = DefaultReplicaTimeout
	}
	if err := CheckFixed(c.Fixed); err != nil {
		return err
	}
	if c.Watchdog < MinLease || c.Watchdog > MaxLease {
		return fmt.Errorf("watchdog lease %v outside [%v, %v]", c.Watchdog, MinLease, MaxLease)
	}
	if c.ReplicaAcks < 0 || c.ReplicaAcks > maxReplicaAcks {
		return fmt.Errorf("replica acks %d outside [0, %d]", c.ReplicaAcks, maxReplicaAcks)
	}
	if c.ReplicaTimeout < 0 || c.ReplicaTimeout > maxReplicaTimeout {
		return fmt.Errorf("replica timeout %v outside [0, %v]", c.ReplicaTimeout, maxReplicaTimeout)
	}
	return nil
}

// CheckFixed checks a fixed lease: zero (none) or within [MinLease,
// MaxLease].
func CheckFixed(d time.Duration) error {
	if d == 0 || (d >= MinLease && d <= MaxLease) {
		return nil
	}
	return fmt.Errorf("lease %v outside [%v, %v]", d, MinLease, MaxLease)
}

// Effective returns the lease every hold gets and whether the watchdog
// renews it.
func (c *Config) Effective() (time.Duration, bool) {
	if c.Fixed == 0 {
		return c.Watchdog, true
	}
	return c.Fixed, false
}
