package mutex

import "context"

// Lock creates the Mutex for name and locks it, waiting as (*Mutex).Lock
// does: one call for the common case of a lock taken and released in one
// place. The Mutex it returns is held; release it with its Unlock. On
// error it returns nil and holds nothing.
//
//	m, err := locks.Lock(ctx, "order:42")
//	if err != nil {
//		return err
//	}
//	defer m.Unlock(context.WithoutCancel(ctx))
func (l *Locker) Lock(ctx context.Context, name string, opts ...LockOption) (*Mutex, error) {
	return l.lockNew(ctx, name, opts, (*Mutex).Lock)
}

// TryLock creates the Mutex for name and makes one attempt to lock it, as
// (*Mutex).TryLock does: ErrNotObtained if another owner holds it. The
// Mutex it returns is held; on error it returns nil and holds nothing.
func (l *Locker) TryLock(ctx context.Context, name string, opts ...LockOption) (*Mutex, error) {
	return l.lockNew(ctx, name, opts, (*Mutex).TryLock)
}

func (l *Locker) lockNew(ctx context.Context, name string, opts []LockOption, lock func(*Mutex, context.Context) error) (*Mutex, error) {
	m, err := l.NewMutex(name, opts...)
	if err != nil {
		return nil, err
	}
	if err := lock(m, ctx); err != nil {
		return nil, err
	}
	return m, nil
}
