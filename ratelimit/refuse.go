package ratelimit

import (
	"errors"
	"net/http"
	"strconv"
)

// StatusError is what a KeyFunc or PolicyFunc returns to answer a request
// itself instead of limiting it: a request without the header its key
// comes from gets 401 or 400 rather than sharing one "anonymous" key with
// every other such request. The middleware answers it with Code and
// Message, and that is all: it is not a Redis error, so neither OnError nor
// a Fallback sees it, and nothing is counted. Code must be a client error
// (400 to 499); any other Code is a mistake of the KeyFunc's, answered with
// 500 and told to OnError.
//
//	KeyFunc: func(r *http.Request) (string, error) {
//		user := r.Header.Get("X-User")
//		if user == "" {
//			return "", &ratelimit.StatusError{Code: http.StatusUnauthorized, Message: "no X-User"}
//		}
//		return "user:" + user, nil
//	},
type StatusError struct {
	Code    int
	Message string // the response body, as http.Error writes it; default the status text
}

func (e *StatusError) Error() string {
	return "ratelimit: request refused with " + strconv.Itoa(e.Code) + ": " + e.Message
}

// refusal returns err's StatusError if it carries a client error status.
func refusal(err error) (*StatusError, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.Code >= 400 && se.Code <= 499 {
		return se, true
	}
	return nil, false
}

// refuse answers a request with se.
func refuse(w http.ResponseWriter, se *StatusError) {
	msg := se.Message
	if msg == "" {
		msg = http.StatusText(se.Code)
	}
	http.Error(w, msg, se.Code)
}
