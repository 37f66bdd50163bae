package storagetest

import "testing"

// TestDecodeDiffOps pins the decoding that the committed seeds rely on.
func TestDecodeDiffOps(t *testing.T) {
	got := decodeDiffOps([]byte{0, 161, 19, 47, 1, 241, 7, 0, 180, 160, 181, 161, 189, 162, 184, 0, 255, 3, 179, 1})
	want := []string{
		`Acquire("a", "o1", "fp1", 10ms)`, "step 11.3ms", `Complete("a", "o1", "r2", 15ms)`, `Release("b", "o1")`,
		`Issue("a", 10ms)`, `AcquireIssued("a", "o1", "fp1", 10ms)`, `AcquireIssued("b", "o2", "fp2", 10ms)`, `Issue("", 0s)`,
		`AcquireIssued("b", "o1", "ffffffff", 0s)`, "step 0s",
	}
	if len(got) != len(want) {
		t.Fatalf("%d ops %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("op %d = %v, want %s", i, got[i], want[i])
		}
	}
}
