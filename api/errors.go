package api

import (
	"errors"
	"fmt"
	"net/http"
)

// Stable error codes. Scripts may match on them; messages may change.
const (
	CodeNotFound       = "not_found"
	CodeInvalid        = "invalid_argument"
	CodeConflict       = "conflict"
	CodeForbidden      = "forbidden"
	CodePinned         = "pinned"
	CodeInUse          = "in_use"
	CodeDigestMismatch = "digest_mismatch"
	CodeUnavailable    = "unavailable"
	CodeFailed         = "failed" // a pull ended Failed
	CodeTimeout        = "timeout"
	CodeRateLimited    = "rate_limited" // too many requests of one caller lately; try again later
	CodeInternal       = "internal"
)

// Sentinels: errors.Is(err, api.ErrNotFound) holds for an *Error with the
// matching code.
var (
	ErrNotFound       = errors.New("not found")
	ErrInvalid        = errors.New("invalid argument")
	ErrConflict       = errors.New("conflict")
	ErrForbidden      = errors.New("forbidden")
	ErrPinned         = errors.New("pinned")
	ErrInUse          = errors.New("in use")
	ErrDigestMismatch = errors.New("digest mismatch")
	ErrUnavailable    = errors.New("daemon unavailable")
	ErrFailed         = errors.New("failed")
	ErrTimeout        = errors.New("timeout")
	ErrRateLimited    = errors.New("rate limited")
)

var codeSentinel = map[string]error{
	CodeNotFound: ErrNotFound, CodeInvalid: ErrInvalid, CodeConflict: ErrConflict,
	CodeForbidden: ErrForbidden, CodePinned: ErrPinned, CodeInUse: ErrInUse, CodeDigestMismatch: ErrDigestMismatch,
	CodeUnavailable: ErrUnavailable, CodeFailed: ErrFailed, CodeTimeout: ErrTimeout, CodeRateLimited: ErrRateLimited,
}

var codeStatus = map[string]int{
	CodeNotFound: http.StatusNotFound, CodeInvalid: http.StatusBadRequest, CodeConflict: http.StatusConflict,
	CodeForbidden: http.StatusForbidden, CodePinned: http.StatusConflict, CodeInUse: http.StatusConflict, CodeDigestMismatch: http.StatusUnprocessableEntity,
	CodeUnavailable: http.StatusServiceUnavailable, CodeFailed: http.StatusUnprocessableEntity,
	CodeTimeout: http.StatusGatewayTimeout, CodeInternal: http.StatusInternalServerError, CodeRateLimited: http.StatusTooManyRequests,
}

// Error is an error as it crosses the socket.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the sentinel of the code, so errors.Is works.
func (e *Error) Unwrap() error { return codeSentinel[e.Code] }

// HTTPStatus is the status the daemon sends for code.
func HTTPStatus(code string) int {
	if s, ok := codeStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Errorf builds an *Error with a code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Status: HTTPStatus(code), Code: code, Message: fmt.Sprintf(format, args...)}
}
