package semaphore

import "time"

// Lease returns the lease of the permits m grants, and whether m renews it
// while a permit is held: true for a watchdog lease (Options.Lease zero),
// false for a fixed Options.Lease, after which a permit expires however
// long its holder keeps it. Code that holds permits for as long as
// something runs, such as ratelimit's concurrency middleware, can refuse a
// Manager that does not renew.
func (m *Manager) Lease() (lease time.Duration, renewed bool) {
	return m.lease, m.watchdog
}
