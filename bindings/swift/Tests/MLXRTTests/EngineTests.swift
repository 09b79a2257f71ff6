// Tests of the Swift package against the real default model. Run by
// scripts/test.sh (which builds target/release/libmlxrt.so first), or from
// this folder:
//   MLXRT_MODEL=~/.cache/mlxrt/models/SmolLM2-135M-Instruct.Q4_1.gguf swift test \
//     -Xlinker -L../../target/release -Xlinker -rpath -Xlinker "$PWD/../../target/release"
import Foundation
import MLXRT
import XCTest

struct SetupError: Error, CustomStringConvertible {
    let description: String
}

/// One engine for all tests (loading takes a while), made on first use.
private let sharedEngine: Result<Engine, Error> = Result {
    guard let path = ProcessInfo.processInfo.environment["MLXRT_MODEL"], !path.isEmpty else {
        throw SetupError(description: "MLXRT_MODEL is not set: run scripts/setup.sh, then scripts/test.sh "
            + "(or set MLXRT_MODEL to ~/.cache/mlxrt/models/SmolLM2-135M-Instruct.Q4_1.gguf)")
    }
    guard FileManager.default.fileExists(atPath: path) else {
        throw SetupError(description: "MLXRT_MODEL=\(path) does not exist: run scripts/setup.sh")
    }
    var configuration = EngineConfiguration(modelPath: path)
    configuration.maxRows = 8
    return try Engine(configuration)
}

/// What one stream yielded.
private struct Collected: Sendable {
    var text = ""
    var tokens: [UInt32] = []
    var logprobs: [TokenLogprob] = []
    var textEvents = 0
    var finish: FinishReason?
    var usage: Usage?
}

private func collect(_ stream: AsyncThrowingStream<Event, Error>) async throws -> Collected {
    var out = Collected()
    for try await event in stream {
        XCTAssertNil(out.finish, "an event after .done")
        switch event {
        case .text(let text, let tokens, let logprobs):
            out.text += text
            out.tokens += tokens
            out.logprobs += logprobs
            out.textEvents += 1
        case .reasoning, .toolCall:
            break
        case .done(let reason, let usage):
            out.finish = reason
            out.usage = usage
        }
    }
    return out
}

private func parameters(maxTokens: UInt32) -> GenerateParameters {
    var p = GenerateParameters()
    p.maxTokens = maxTokens
    return p
}

/// Waits (up to `seconds`) until the counters satisfy `done`: stats lag the
/// events by a moment.
private func waitForStats(_ engine: Engine, seconds: Double, _ done: (EngineStats) -> Bool) async -> EngineStats {
    let deadline = Date().addingTimeInterval(seconds)
    var s = engine.stats
    while !done(s) && Date() < deadline {
        try? await Task.sleep(nanoseconds: 10_000_000)
        s = engine.stats
    }
    return s
}

final class EngineTests: XCTestCase {
    func testStreamsAGreedyAnswer() async throws {
        let engine = try sharedEngine.get()
        let question: [Message] = [.user("What is the capital of France?")]
        let first = try await collect(engine.generate(messages: question, parameters: parameters(maxTokens: 24)))
        XCTAssertTrue(first.text.contains("Paris"), "answer: \(first.text)")
        XCTAssertGreaterThan(first.textEvents, 0)
        XCTAssertTrue(first.finish == .stop || first.finish == .length, "finish: \(String(describing: first.finish))")
        let usage = try XCTUnwrap(first.usage)
        XCTAssertGreaterThan(usage.promptTokens, 0)
        XCTAssertGreaterThanOrEqual(usage.completionTokens, first.tokens.count)
        XCTAssertGreaterThan(usage.timeToFirstToken, 0)
        XCTAssertTrue(first.logprobs.isEmpty, "no log-probabilities unless asked")
        // Greedy decoding is deterministic.
        let again = try await collect(engine.generate(messages: question, parameters: parameters(maxTokens: 24)))
        XCTAssertEqual(again.text, first.text)
        XCTAssertEqual(again.tokens, first.tokens)
    }

    func testEndingTheLoopCancels() async throws {
        let engine = try sharedEngine.get()
        let before = await waitForStats(engine, seconds: 10) { $0.inFlight == 0 }
        var p = parameters(maxTokens: 4000)
        p.optionsJSON = #"{"ignore_eos": true}"#
        var textEvents = 0
        for try await event in engine.generate(messages: [.user("Tell me a very long story.")], parameters: p) {
            if case .text = event {
                textEvents += 1
                if textEvents == 3 { break }  // ends the stream: cancels the request
            }
        }
        XCTAssertEqual(textEvents, 3)
        // 4000 tokens would take far longer than this: the request was cancelled.
        let after = await waitForStats(engine, seconds: 5) { $0.inFlight == 0 && $0.completed > before.completed }
        XCTAssertEqual(after.inFlight, 0, "the request still runs after the loop ended")
        XCTAssertEqual(after.completed, before.completed + 1)
    }

    func testBadModelPathThrows() throws {
        XCTAssertThrowsError(try Engine(EngineConfiguration(modelPath: "/nonexistent/model.gguf"))) { error in
            guard let error = error as? MLXRTError else {
                return XCTFail("not an MLXRTError: \(error)")
            }
            XCTAssertEqual(error.code, .modelLoad)
            XCTAssertTrue(error.message.contains("/nonexistent/model.gguf"), "message: \(error.message)")
        }
    }

    func testBadRequestThrowsFromTheStream() async throws {
        let engine = try sharedEngine.get()
        var p = parameters(maxTokens: 4)
        p.optionsJSON = "{"
        do {
            _ = try await collect(engine.generate(messages: [.user("x")], parameters: p))
            XCTFail("a request with bad options JSON streamed")
        } catch let error as MLXRTError {
            XCTAssertEqual(error.code, .invalidJSON, "\(error)")
        }
    }

    /// The default model has no vision tower: an image part is refused
    /// (naming the part), never answered as text only; a short pixel buffer
    /// is refused before that.
    func testImagesNeedAVisionTower() async throws {
        let engine = try sharedEngine.get()
        XCTAssertEqual(engine.info.modalities & 2, 0)  // no MLXRT_MODALITY_IMAGE
        let pixels = ImageInput.pixels(Data(repeating: 128, count: 2 * 2 * 4), width: 2, height: 2, format: .bgra8)
        let short = ImageInput.pixels(Data(count: 4), width: 2, height: 2, format: .bgra8)
        for (image, code, says) in [(pixels, MLXRTError.Code.unsupported, "messages[0].content[0]"),
                                    (short, .invalidArgument, "media[0]")] {
            do {
                _ = try await collect(engine.generate(messages: [.user("What is it?", images: [image])],
                                                      parameters: parameters(maxTokens: 4)))
                XCTFail("an image request streamed")
            } catch let error as MLXRTError {
                XCTAssertEqual(error.code, code, "\(error)")
                XCTAssertTrue(error.message.contains(says), error.message)
            }
        }
    }

    func testResponseFormat() async throws {
        let engine = try sharedEngine.get()
        var p = parameters(maxTokens: 16)
        p.optionsJSON = #"{"ignore_eos": true}"#
        p.responseFormat = .regex("[0-9]{3}-[0-9]{4}")
        let out = try await collect(engine.generate(messages: [.user("Give a phone number.")], parameters: p))
        XCTAssertEqual(out.finish, .stop, "a complete match ends the stream")
        XCTAssertEqual(out.text.count, 8, out.text)
        XCTAssertEqual(Array(out.text)[3], "-", out.text)
        p.responseFormat = .jsonSchema(#"{"type": "frobnicate"}"#)
        do {
            _ = try await collect(engine.generate(messages: [.user("x")], parameters: p))
            XCTFail("an uncompilable schema streamed")
        } catch let error as MLXRTError {
            XCTAssertEqual(error.code, .invalidArgument, "\(error)")
            XCTAssertTrue(error.message.hasPrefix("response_format: "), error.message)
        }
    }

    func testSpeculation() async throws {
        let engine = try sharedEngine.get()
        var p = parameters(maxTokens: 16)
        let plain = try await collect(engine.generate(messages: [.user("Name three colours.")], parameters: p))
        p.optionsJSON = #"{"ignore_eos": false}"#
        p.speculation = .ngram(numTokens: 4)
        let spec = try await collect(engine.generate(messages: [.user("Name three colours.")], parameters: p))
        XCTAssertEqual(spec.text, plain.text, "greedy output is unchanged")
        p.speculation = .draft()
        do {
            _ = try await collect(engine.generate(messages: [.user("x")], parameters: p))
            XCTFail("draft speculation without a draft model streamed")
        } catch let error as MLXRTError {
            XCTAssertEqual(error.code, .invalidArgument, "\(error)")
        }
        XCTAssertEqual(Speculation.draft(numTokens: 4).json, #"{"type":"draft","num_tokens":4}"#)
    }

    func testEightConcurrentGenerations() async throws {
        let engine = try sharedEngine.get()
        let questions = ["Name a color.", "What is 2+2?", "Say hello.", "Name a fruit.",
                         "What is the capital of Italy?", "Name an animal.", "Count to three.", "Say goodbye."]
        let results = try await withThrowingTaskGroup(
            of: (Int, Collected).self, returning: [Int: Collected].self
        ) { group in
            for (i, q) in questions.enumerated() {
                group.addTask {
                    (i, try await collect(engine.generate(messages: [.user(q)], parameters: parameters(maxTokens: 16))))
                }
            }
            var out = [Int: Collected]()
            for try await (i, c) in group { out[i] = c }
            return out
        }
        XCTAssertEqual(results.count, 8)
        for (i, c) in results {
            XCTAssertFalse(c.text.isEmpty, "request \(i) made no text")
            XCTAssertTrue(c.finish == .stop || c.finish == .length, "request \(i): \(String(describing: c.finish))")
        }
    }

    func testInfoAndStats() async throws {
        let engine = try sharedEngine.get()
        let info = engine.info
        XCTAssertEqual(info.architecture, "llama")
        XCTAssertEqual(info.modelFormat, "gguf")
        XCTAssertFalse(info.device.isEmpty)
        XCTAssertFalse(info.mlxVersion.isEmpty)
        XCTAssertGreaterThan(info.vocabSize, 1000)
        XCTAssertGreaterThan(info.numLayers, 0)
        XCTAssertGreaterThan(info.contextLength, 0)
        XCTAssertFalse(info.eosTokenIDs.isEmpty)
        XCTAssertTrue(info.hasChatTemplate)

        let before = await waitForStats(engine, seconds: 10) { $0.inFlight == 0 }
        _ = try await collect(engine.generate(messages: [.user("Hi")], parameters: parameters(maxTokens: 2)))
        let after = await waitForStats(engine, seconds: 5) { $0.completed > before.completed }
        XCTAssertEqual(after.completed, before.completed + 1)
        XCTAssertGreaterThan(after.peakMemory, 0)
    }

    func testTokenizerAndChatTemplate() async throws {
        let engine = try sharedEngine.get()
        let ids = try engine.tokenize("Hello world")
        XCTAssertGreaterThanOrEqual(ids.count, 2)
        XCTAssertEqual(try engine.detokenize(ids), "Hello world")
        let special = try engine.tokenize("<|im_start|>", parseSpecial: true)
        XCTAssertEqual(special.count, 1)
        XCTAssertTrue(special.allSatisfy { engine.info.specialTokenIDs.contains($0) })
        XCTAssertGreaterThan(try engine.tokenize("<|im_start|>").count, 1)
        XCTAssertEqual(try engine.detokenize(special + ids, skipSpecial: true), "Hello world")
        XCTAssertEqual(try engine.detokenize([]), "")

        let messages: [Message] = [.user("Hi!")]
        let rendered = try engine.renderChat(messages: messages)
        XCTAssertTrue(rendered.text.contains("Hi!"))
        XCTAssertEqual(try engine.detokenize(rendered.tokens), rendered.text)
        let run = try await collect(engine.generate(messages: messages, parameters: parameters(maxTokens: 2)))
        XCTAssertEqual(run.usage?.promptTokens, rendered.tokens.count, "a request processes the rendered prompt")
        XCTAssertThrowsError(try engine.renderChat(messages: messages, optionsJSON: "{")) { error in
            XCTAssertEqual((error as? MLXRTError)?.code, .invalidJSON)
        }
    }

    func testLogprobs() async throws {
        let engine = try sharedEngine.get()
        var p = parameters(maxTokens: 12)
        p.logprobs = true
        p.topLogprobs = 3
        let c = try await collect(engine.generate(messages: [.user("What is the capital of France?")], parameters: p))
        XCTAssertEqual(c.logprobs.count, c.tokens.count)
        XCTAssertFalse(c.logprobs.isEmpty)
        for (lp, token) in zip(c.logprobs, c.tokens) {
            XCTAssertEqual(lp.token, token)
            XCTAssertLessThanOrEqual(lp.logprob, 0)
            XCTAssertEqual(lp.top.count, 3)
            guard lp.top.count == 3 else { continue }
            XCTAssertGreaterThanOrEqual(lp.top[0].logprob, lp.top[1].logprob)
            XCTAssertGreaterThanOrEqual(lp.top[1].logprob, lp.top[2].logprob)
            XCTAssertEqual(lp.top[0].token, lp.token, "greedy picks the most likely token")
        }
    }
}
