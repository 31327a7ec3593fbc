package store

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
)

// Code is the outcome of one page of an operation.
type Code uint8

const (
	CodePending Code = iota
	CodeOK
	CodeNotFound
	CodeCorrupt
	CodeNoSpace
	CodeDeadline
	CodeIOError
	CodeCancelled
)

// Result is one page's outcome, in request order.
type Result struct {
	Code Code
	Tier catalog.Tier
	Msg  string
}

func okResult(t catalog.Tier) Result { return Result{Code: CodeOK, Tier: t} }

// FailResult classifies an error into a page result.
func FailResult(err error) Result {
	var ce *page.CorruptError
	switch {
	case errors.As(err, &ce):
		return Result{Code: CodeCorrupt, Msg: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return Result{Code: CodeDeadline, Msg: err.Error()}
	case errors.Is(err, context.Canceled):
		return Result{Code: CodeCancelled, Msg: err.Error()}
	case errors.Is(err, ErrNoSpace), errors.Is(err, catalog.ErrNoSpace), errors.Is(err, syscall.ENOSPC):
		return Result{Code: CodeNoSpace, Msg: err.Error()}
	case errors.Is(err, ErrNotFound):
		return Result{Code: CodeNotFound, Msg: err.Error()}
	}
	return Result{Code: CodeIOError, Msg: err.Error()}
}

// ErrNotFound reports a page no tier holds.
var ErrNotFound = errors.New("page not found")

func notFound(format string, args ...any) Result {
	return FailResult(fmt.Errorf("%w: "+format, append([]any{ErrNotFound}, args...)...))
}
