package mutex

import (
	"strconv"
	"time"
)

// SetWriterMark gives rw's Lock calls a writer-waiting mark of d instead of
// min(lease, 2 s), so that a test can look at a mark without racing its
// end. Call it before rw is used.
func SetWriterMark(rw *RWMutex, d time.Duration) {
	rw.mark = d
	rw.markMs = strconv.FormatInt(d.Milliseconds(), 10)
}
