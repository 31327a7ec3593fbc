package fabric

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
)

// pageCode is the outcome of one page of an operation.
type pageCode uint8

const (
	codePending pageCode = iota
	codeOK
	codeNotFound
	codeCorrupt
	codeNoSpace
	codeDeadline
	codeIOError
	codeCancelled
)

// pageResult is one page's outcome, in request order.
type pageResult struct {
	Code pageCode
	Tier catalog.Tier
	Msg  string
}

func okResult(t catalog.Tier) pageResult { return pageResult{Code: codeOK, Tier: t} }

// failResult classifies an error into a page result.
func failResult(err error) pageResult {
	var ce *page.CorruptError
	switch {
	case errors.As(err, &ce):
		return pageResult{Code: codeCorrupt, Msg: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return pageResult{Code: codeDeadline, Msg: err.Error()}
	case errors.Is(err, context.Canceled):
		return pageResult{Code: codeCancelled, Msg: err.Error()}
	case errors.Is(err, errNoSpace), errors.Is(err, catalog.ErrNoSpace), errors.Is(err, syscall.ENOSPC):
		return pageResult{Code: codeNoSpace, Msg: err.Error()}
	case errors.Is(err, errNotFound):
		return pageResult{Code: codeNotFound, Msg: err.Error()}
	}
	return pageResult{Code: codeIOError, Msg: err.Error()}
}

// errNotFound reports a page no tier holds.
var errNotFound = errors.New("page not found")

func notFound(format string, args ...any) pageResult {
	return failResult(fmt.Errorf("%w: "+format, append([]any{errNotFound}, args...)...))
}

func wrapNotFound(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errNotFound}, args...)...)
}
