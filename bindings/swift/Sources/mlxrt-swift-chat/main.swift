// Streams a chat answer with the Swift package.
//   swift run mlxrt-swift-chat MODEL_PATH ["question"]
import Foundation
import MLXRT

let args = CommandLine.arguments
guard args.count > 1 else {
    print("usage: mlxrt-swift-chat MODEL_PATH [\"question\"]")
    exit(2)
}
let question = args.count > 2 ? args[2] : "Explain in two sentences why the sky is blue."

do {
    let engine = try Engine(EngineConfiguration(modelPath: args[1]))
    var parameters = GenerateParameters()
    parameters.maxTokens = 200
    for try await event in engine.generate(messages: [.user(question)], parameters: parameters) {
        switch event {
        case .text(let text, _, _):
            print(text, terminator: "")
        case .reasoning, .toolCall:
            break
        case .done(let reason, let usage):
            print("\n[\(reason), \(usage.completionTokens) tokens, \(usage.decodeTokensPerSecond) tok/s]")
        }
    }
} catch let error as MLXRTError {
    print("mlxrt error \(error.code): \(error.message)")
    exit(1)
}
