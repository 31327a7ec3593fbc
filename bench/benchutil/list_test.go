package benchutil

import "testing"

func TestSplitList(t *testing.T) {
	if got := SplitList(" a, ,b ,"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("SplitList: %q", got)
	}
}
