package messages

import "github.com/kvxfer/kvxfer/messages/pb"

// incarnationsToWire copies f's incarnations (Hello.Incarnation, the
// Incarnations of RequestData, Result, Cancel, CancelAck, Misaddressed),
// features (Hello's, RequestData's) and Hello.MaxFrameBytes into env's body, which toWire
// built from f.
func incarnationsToWire(env *pb.Envelope, f Frame) {
	switch b := env.GetBody().(type) {
	case *pb.Envelope_Hello:
		h := f.(*Hello)
		b.Hello.Incarnation = h.Incarnation
		b.Hello.Features = h.Features
		b.Hello.MaxFrameBytes = h.MaxFrameBytes
		if !h.Process.IsZero() {
			b.Hello.Process = &pb.ProcessID{Pid: h.Process.Pid, StartTime: h.Process.StartTime, Host: h.Process.Host}
		}
	case *pb.Envelope_RequestData:
		rd := f.(*RequestData)
		in := rd.Incarnations
		b.RequestData.FromIncarnation, b.RequestData.ToIncarnation = in.FromIncarnation, in.ToIncarnation
		b.RequestData.Features = rd.Features
	case *pb.Envelope_Result:
		in := f.(*Result).Incarnations
		b.Result.FromIncarnation, b.Result.ToIncarnation = in.FromIncarnation, in.ToIncarnation
	case *pb.Envelope_Cancel:
		in := f.(*Cancel).Incarnations
		b.Cancel.FromIncarnation, b.Cancel.ToIncarnation = in.FromIncarnation, in.ToIncarnation
	case *pb.Envelope_CancelAck:
		in := f.(*CancelAck).Incarnations
		b.CancelAck.FromIncarnation, b.CancelAck.ToIncarnation = in.FromIncarnation, in.ToIncarnation
	case *pb.Envelope_Misaddressed:
		in := f.(*Misaddressed).Incarnations
		b.Misaddressed.FromIncarnation, b.Misaddressed.ToIncarnation = in.FromIncarnation, in.ToIncarnation
	}
}

// incarnationsFromWire copies the incarnations of env's body into f, the
// frame fromWire decoded from it. Any incarnation is in range (0: not
// known); Hello.Validate range-checks MaxFrameBytes.
func incarnationsFromWire(env *pb.Envelope, f Frame) {
	switch b := env.GetBody().(type) {
	case *pb.Envelope_Hello:
		h := f.(*Hello)
		h.Incarnation = b.Hello.GetIncarnation()
		h.Features = b.Hello.GetFeatures()
		h.MaxFrameBytes = b.Hello.GetMaxFrameBytes()
		if p := b.Hello.GetProcess(); p != nil {
			h.Process = ProcessID{Pid: p.GetPid(), StartTime: p.GetStartTime(), Host: p.GetHost()}
		}
	case *pb.Envelope_RequestData:
		rd := f.(*RequestData)
		rd.Incarnations = Incarnations{b.RequestData.GetFromIncarnation(), b.RequestData.GetToIncarnation()}
		rd.Features = b.RequestData.GetFeatures()
	case *pb.Envelope_Result:
		f.(*Result).Incarnations = Incarnations{b.Result.GetFromIncarnation(), b.Result.GetToIncarnation()}
	case *pb.Envelope_Cancel:
		f.(*Cancel).Incarnations = Incarnations{b.Cancel.GetFromIncarnation(), b.Cancel.GetToIncarnation()}
	case *pb.Envelope_CancelAck:
		f.(*CancelAck).Incarnations = Incarnations{b.CancelAck.GetFromIncarnation(), b.CancelAck.GetToIncarnation()}
	case *pb.Envelope_Misaddressed:
		f.(*Misaddressed).Incarnations = Incarnations{b.Misaddressed.GetFromIncarnation(), b.Misaddressed.GetToIncarnation()}
	}
}
