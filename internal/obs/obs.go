// Package obs holds what the primitives share to fill in
// scriptcache.Event: the reasons of losses and failed acquisitions.
package obs

import (
	"context"
	"errors"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/notify"
	"github.com/sluicekit/sluice/scriptcache"
)

// LossReason returns the Event.Reason of a loss with the given cause: the
// lease ran out with renewals failing (expired), the server no longer has
// it (gone), the keeper was closed (closed), or a call found it not held.
func LossReason(cause error) string {
	switch {
	case errors.Is(cause, lease.ErrExpired):
		return scriptcache.ReasonExpired
	case errors.Is(cause, lease.ErrGone):
		return scriptcache.ReasonGone
	case errors.Is(cause, lease.ErrClosed):
		return scriptcache.ReasonClosed
	}
	return scriptcache.ReasonNotHeld
}

// FailReason returns the Event.Reason of an acquisition that failed with
// err. closed and notReplicated are the primitive's own errors for a
// closed Locker or Manager and for too few replica acknowledgements; busy
// is the reason when err is none of the others (a try that found the
// resource taken: ReasonBusy; else ReasonError).
func FailReason(err, closed, notReplicated error, busy string) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return scriptcache.ReasonTimeout
	case errors.Is(err, context.Canceled):
		return scriptcache.ReasonCanceled
	case errors.Is(err, closed), errors.Is(err, notify.ErrClosed), errors.Is(err, lease.ErrClosed):
		return scriptcache.ReasonClosed
	case errors.Is(err, notify.ErrSubscribe):
		return scriptcache.ReasonRefused
	case errors.Is(err, notReplicated):
		return scriptcache.ReasonNotReplicated
	}
	return busy
}
