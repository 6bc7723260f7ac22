package chaos

import "testing"

// TestProgramError pins which script errors the check counts: a Lua
// runtime error or a call made wrongly, in the forms Redis 7 (as rueidis
// shows it, without the generic code) and Redis 6 give them; never an
// error with a code of its own, nor one a script returned on purpose.
func TestProgramError(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{"user_script:43: bad argument #1 to 'find' (string expected, got nil) script: fc57ad62, on @user_script:43.", true},
		{"ERR user_script:1: attempt to compare string with number script: 100d4560, on @user_script:1.", true},
		{"Lua redis lib command arguments must be strings or integers script: bc5ae1cc, on @user_script:48.", true},
		{"ERR Error running script (call to f_1): @user_script:1: user_script:1: attempt to perform arithmetic on a nil value", true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value script: cb6a9b05, on @user_script:1.", false},
		{"ERR Error running script (call to f_1): @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"NOPERM this user has no permissions to access one of the channels used as arguments script: 1, on @user_script:9.", false},
		{"NOSCRIPT No matching script. Please use EVAL.", false},
		{"mutex_lock: malformed attempt id", false},
	} {
		if got := programMessage(tt.msg); got != tt.want {
			t.Errorf("%q: counted %v, want %v", tt.msg, got, tt.want)
		}
	}
}
