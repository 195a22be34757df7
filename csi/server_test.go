package csi

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrorsAreSafeForKubelet: kubelet passes a failed publish's message
// to its event recorder as a format string, so a '%' in it would show in
// kubectl describe as "%!,(MISSING)"; the driver writes each as "pct" and
// keeps the code.
func TestErrorsAreSafeForKubelet(t *testing.T) {
	d, err := New(Config{Socket: "/run/x/csi.sock", NodeID: "n"}, noHolds{})
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, any) (any, error) {
		return nil, status.Error(codes.Unavailable, "model m downloading 41%, from GET /org%2Fm")
	}
	_, err = d.logCalls(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Node/NodePublishVolume"}, h)
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || st.Message() != "model m downloading 41pct, from GET /orgpct2Fm" {
		t.Errorf("got %s %q, want Unavailable without a %%", st.Code(), st.Message())
	}
}
