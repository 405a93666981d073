"""edgesched.policies: ONNX models and their onnxruntime inference, with loud fallbacks."""
