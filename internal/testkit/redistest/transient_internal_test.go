package redistest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

// TestTransient: MigrateSlot retries a step that met a server that did not
// answer, and only that: a refusal (a slot's keys still on the old owner,
// a wrong argument) is returned at once.
func TestTransient(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{fmt.Errorf("wrapped: %w", io.EOF), true},
		{io.ErrUnexpectedEOF, true},
		{syscall.ECONNRESET, true},
		{errors.New("IOERR error or timeout reading to target instance"), true},
		{errors.New("CLUSTERDOWN The cluster is down"), true},
		{errors.New("LOADING Redis is loading the dataset in memory"), true},
		{errors.New("ERR Can't assign hashslot 5 to a different node while I still hold keys for this hash slot."), false},
		{errors.New("ERR I'm not the owner of hash slot 5"), false},
		{errors.New("NOKEY"), false},
	} {
		if got := transient(tt.err); got != tt.want {
			t.Errorf("transient(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
