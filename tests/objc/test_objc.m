// Tests of the Objective-C wrapper (bindings/objc) against the real default
// model, and its images against the tiny vision-language checkpoint of
// tests/media.rs. Built with clang + GNUstep and run by tests/objc.rs.
//
//   test_objc MODEL_PATH VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT TOKENS
//
// IMAGE.rgb holds the PNG's decoded pixels (packed RGB8); TOKENS are
// mlx-vlm's greedy tokens for the image and "What is in this picture?"
// (comma-separated).
#import "MLXRT.h"

#include <Block.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../c/check.h"
#include "mlxrt.h"

#if __has_feature(objc_arc)
#define MRC_RELEASE(x) ((void)0)
#else
#define MRC_RELEASE(x) [(x) release]
#endif

/// Tags the test's queue: a handler finds it with dispatch_get_specific.
static const char QUEUE_KEY = 0;
static char QUEUE_TAG[] = "test-queue";

/// Everything one request's handler saw. Written only on the serial queue,
/// read by the main thread after `done` is signalled.
@interface Recorder : NSObject {
  @public
    NSMutableString *text;
    NSMutableArray<MLXRTEvent *> *textEventList;
    NSUInteger textEvents, tokenCount, finals, afterFinal, offQueue;
    uint64_t requestID;
    BOOL mixedIDs;
    MLXRTEvent *last;
    dispatch_semaphore_t done;
    dispatch_semaphore_t firstText;
    MLXRTRequestTask *cancelOnText;  // cancel from inside the handler
    MLXRTEventHandler heldHandler;   // MRC: the heap copy handed out
}
- (MLXRTEventHandler)handler;
- (BOOL)wait;
@end

@implementation Recorder
- (instancetype)init {
    if ((self = [super init])) {
        text = [[NSMutableString alloc] init];
        textEventList = [[NSMutableArray alloc] init];
        done = dispatch_semaphore_create(0);
        firstText = dispatch_semaphore_create(0);
    }
    return self;
}

- (MLXRTEventHandler)handler {
    Recorder *r = self;  // outlives the request: main waits on `done`
    MLXRTEventHandler handler = ^(MLXRTEvent *ev) {
        if (dispatch_get_specific(&QUEUE_KEY) != QUEUE_TAG) r->offQueue++;
        if (r->finals) r->afterFinal++;
        if (r->requestID == 0) r->requestID = ev.requestID;
        if (ev.requestID != r->requestID) r->mixedIDs = YES;
        if (ev.kind == MLXRTEventKindText) {
            [r->text appendString:ev.text];
            [r->textEventList addObject:ev];
            r->tokenCount += ev.tokenIDs.count;
            if (r->textEvents++ == 0) dispatch_semaphore_signal(r->firstText);
            if (r->cancelOnText) [r->cancelOnText cancel];
            return;
        }
        r->finals++;
#if !__has_feature(objc_arc)
        [ev retain];
        [r->last release];
#endif
        r->last = ev;
        dispatch_semaphore_signal(r->done);
    };
#if __has_feature(objc_arc)
    return handler;
#else
    // A block literal lives on the stack; hand out a heap copy (blocks are
    // not objects on the GNU runtime, so no -autorelease).
    if (!heldHandler) heldHandler = Block_copy(handler);
    return heldHandler;
#endif
}

- (BOOL)wait {
    return dispatch_semaphore_wait(done, dispatch_time(DISPATCH_TIME_NOW, 600 * NSEC_PER_SEC)) == 0;
}

#if !__has_feature(objc_arc)
- (void)dealloc {
    [text release];
    [textEventList release];
    [last release];
    if (heldHandler) Block_release(heldHandler);
    dispatch_release(done);
    dispatch_release(firstText);
    [super dealloc];
}
#endif
@end

static MLXRTRequestParameters *chat(NSString *question, NSUInteger maxTokens) {
    MLXRTRequestParameters *p = [MLXRTRequestParameters parametersWithMessages:@[ [MLXRTMessage userMessage:question] ]];
    p.maxTokens = maxTokens;
    return p;
}

static void test_configuration(void) {
    mlxrt_engine_config c;
    mlxrt_engine_config_init(&c);
    MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:@"/m.gguf"];
    CHECK(cfg.maxRows == c.max_rows && cfg.maxInFlight == c.max_in_flight && cfg.kvBudget == c.kv_budget,
          "engine defaults come from mlxrt_engine_config_init");
    CHECK(cfg.device == MLXRTDeviceAutomatic && cfg.promptCacheDirectory == nil && cfg.draftModelPath == nil,
          "device/cache/draft defaults");
    cfg.draftModelPath = @"/d.gguf";
    MLXRTEngineConfiguration *copy = [cfg copy];
    cfg.maxRows = 3;
    cfg.modelPath = @"/other";
    CHECK(copy.maxRows == c.max_rows && [copy.modelPath isEqualToString:@"/m.gguf"] &&
              [copy.draftModelPath isEqualToString:@"/d.gguf"],
          "a copy is independent");
    MRC_RELEASE(copy);
    MRC_RELEASE(cfg);

    mlxrt_request_params rp;
    mlxrt_request_params_init(&rp);
    MLXRTRequestParameters *p = [[MLXRTRequestParameters alloc] init];
    CHECK(p.maxTokens == rp.max_tokens && p.repetitionPenalty == rp.repetition_penalty && p.usesPromptCache,
          "request defaults come from mlxrt_request_params_init");
    CHECK(p.messages == nil && p.seed == nil && p.stopStrings.count == 0, "no input by default");
    MRC_RELEASE(p);
    CHECK([MLXRTEngine.libraryVersion isEqualToString:@MLXRT_VERSION], "version %s",
          MLXRTEngine.libraryVersion.UTF8String);
}

static void test_bad_model(void) {
    MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:@"/nonexistent/model.gguf"];
    NSError *error = nil;
    MLXRTEngine *engine = [[MLXRTEngine alloc] initWithConfiguration:cfg error:&error];
    CHECK(engine == nil, "no engine for a missing model");
    CHECK([error.domain isEqualToString:MLXRTErrorDomain], "domain %s", error.domain.UTF8String);
    CHECK(error.code == MLXRTErrorModelLoad, "code %ld", (long)error.code);
    CHECK([error.localizedDescription rangeOfString:@"/nonexistent/model.gguf"].location != NSNotFound,
          "message names the path: %s", error.localizedDescription.UTF8String);
    CHECK([[MLXRTEngine alloc] initWithConfiguration:cfg error:NULL] == nil, "error:NULL is allowed");
    MRC_RELEASE(cfg);
}

static void test_streaming(MLXRTEngine *engine, dispatch_queue_t queue) {
    Recorder *r = [[Recorder alloc] init];
    NSError *error = nil;
    MLXRTRequestTask *task = [engine submitRequestWithParameters:chat(@"What is the capital of France?", 24)
                                                           queue:queue
                                                    eventHandler:[r handler]
                                                           error:&error];
    CHECK(task != nil && error == nil, "submit: %s", error.localizedDescription.UTF8String);
    CHECK([r wait], "the request ends");
    CHECK(r->offQueue == 0, "%lu events off the given queue", (unsigned long)r->offQueue);
    CHECK(r->textEvents > 0 && r->finals == 1 && r->afterFinal == 0 && !r->mixedIDs, "event order");
    CHECK(r->requestID == task.requestID, "request id");
    CHECK([r->text rangeOfString:@"Paris"].location != NSNotFound, "answer: %s", r->text.UTF8String);
    MLXRTEvent *last = r->last;
    CHECK(last.kind == MLXRTEventKindDone && last.isFinal && last.error == nil, "done event");
    CHECK(last.finishReason == MLXRTFinishReasonStop || last.finishReason == MLXRTFinishReasonLength, "reason");
    // The end-of-sequence token is counted but not reported in a delta.
    NSUInteger counted = last.usage.completionTokens;
    CHECK((counted == r->tokenCount || counted == r->tokenCount + 1) && last.usage.promptTokens > 0,
          "usage %lu vs %lu token ids", (unsigned long)counted, (unsigned long)r->tokenCount);
    CHECK(last.usage.timeToFirstToken > 0 && last.stopIndex == NSNotFound, "timings, stop index");
    [task cancel];  // after the end: harmless
    MRC_RELEASE(r);
}

static void test_stop_and_seed(MLXRTEngine *engine, dispatch_queue_t queue) {
    MLXRTRequestParameters *p = chat(@"Count from 1 to 20, separated by commas.", 48);
    p.stopStrings = @[ @"zzz", @"5" ];
    Recorder *r = [[Recorder alloc] init];
    [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
    CHECK([r wait], "ends");
    CHECK(r->last.finishReason == MLXRTFinishReasonStop && r->last.stopIndex == 1, "stop string 1: %ld",
          (long)r->last.stopIndex);
    CHECK([r->text rangeOfString:@"5"].location == NSNotFound, "stop text withheld: %s", r->text.UTF8String);
    MRC_RELEASE(r);

    // Sampling with a seed is reproducible; prompt tokens work as input.
    NSString *texts[2];
    for (int i = 0; i < 2; i++) {
        MLXRTRequestParameters *q = [[MLXRTRequestParameters alloc] init];
        q.promptTokens = @[ @1, @9690, @198, @19556, @314, @260, @3758, @30, @2, @198, @1, @520, @9531, @198 ];
        q.temperature = 0.9f;
        q.seed = @42;
        q.maxTokens = 12;
        Recorder *s = [[Recorder alloc] init];
        [engine submitRequestWithParameters:q queue:queue eventHandler:[s handler] error:NULL];
        CHECK([s wait] && s->last.kind == MLXRTEventKindDone, "seeded run %d", i);
        texts[i] = [s->text copy];
        MRC_RELEASE(s);
        MRC_RELEASE(q);
    }
    CHECK([texts[0] isEqualToString:texts[1]] && texts[0].length > 0, "seeded runs differ: '%s' vs '%s'",
          texts[0].UTF8String, texts[1].UTF8String);
    MRC_RELEASE(texts[0]);
    MRC_RELEASE(texts[1]);
}

static void test_cancel(MLXRTEngine *engine, dispatch_queue_t queue) {
    MLXRTRequestParameters *p = chat(@"Tell me a very long story about a dragon.", 500);
    p.optionsJSON = @"{\"ignore_eos\": true}";

    // From the caller's thread, after the first text.
    Recorder *r = [[Recorder alloc] init];
    MLXRTRequestTask *task = [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
    dispatch_semaphore_wait(r->firstText, DISPATCH_TIME_FOREVER);
    [task cancel];
    [task cancel];  // idempotent
    CHECK([r wait], "cancelled request ends");
    CHECK(r->last.kind == MLXRTEventKindDone && r->last.finishReason == MLXRTFinishReasonCancelled,
          "finish reason %ld", (long)r->last.finishReason);
    CHECK(r->last.usage.completionTokens < 500 && r->afterFinal == 0, "stopped early, nothing after");
    MRC_RELEASE(r);

    // From inside the handler.
    Recorder *h = [[Recorder alloc] init];
    __block MLXRTRequestTask *inner = nil;
    dispatch_semaphore_t submitted = dispatch_semaphore_create(0);
    // The handler must see the task: submit from the queue itself so the
    // first event cannot run before the task is stored.
    dispatch_async(queue, ^{
        @autoreleasepool {
            inner = [engine submitRequestWithParameters:p queue:queue eventHandler:[h handler] error:NULL];
#if !__has_feature(objc_arc)
            [inner retain];
#endif
            h->cancelOnText = inner;
        }
        dispatch_semaphore_signal(submitted);
    });
    dispatch_semaphore_wait(submitted, DISPATCH_TIME_FOREVER);
    CHECK([h wait], "ends");
    CHECK(h->last.finishReason == MLXRTFinishReasonCancelled && h->textEvents < 100, "cancel from the handler");
    MRC_RELEASE(inner);
    MRC_RELEASE(h);
    dispatch_release(submitted);
}

static MLXRTRequestParameters *no_input(void) {
    MLXRTRequestParameters *p = [[MLXRTRequestParameters alloc] init];
#if !__has_feature(objc_arc)
    [p autorelease];
#endif
    return p;
}

static void test_submit_errors(MLXRTEngine *engine, dispatch_queue_t queue) {
    __block int called = 0;
    MLXRTEventHandler never = ^(MLXRTEvent *ev) {
        (void)ev;
        called++;
    };
    struct {
        const char *what;
        MLXRTErrorCode code;
        MLXRTRequestParameters *p;
    } cases[6];
    cases[0].what = "bad options JSON";
    cases[0].code = MLXRTErrorInvalidJSON;
    cases[0].p = chat(@"x", 4);
    cases[0].p.optionsJSON = @"{\"temperature\": ";
    cases[1].what = "negative temperature";
    cases[1].code = MLXRTErrorInvalidArgument;
    cases[1].p = chat(@"x", 4);
    cases[1].p.temperature = -1;
    cases[2].what = "no input";
    cases[2].code = MLXRTErrorInvalidArgument;
    cases[2].p = no_input();
    cases[3].what = "unknown option";
    cases[3].code = MLXRTErrorInvalidArgument;
    cases[3].p = chat(@"x", 4);
    cases[3].p.optionsJSON = @"{\"temprature\": 1}";
    cases[4].what = "uncompilable response format";
    cases[4].code = MLXRTErrorInvalidArgument;
    cases[4].p = chat(@"x", 4);
    cases[4].p.responseFormat = @"{\"type\": \"regex\", \"pattern\": \"(\"}";
    cases[5].what = "draft speculation without a draft model";
    cases[5].code = MLXRTErrorInvalidArgument;
    cases[5].p = chat(@"x", 4);
    cases[5].p.speculation = @"\"draft\"";
    for (int i = 0; i < 6; i++) {
        NSError *error = nil;
        MLXRTRequestTask *t = [engine submitRequestWithParameters:cases[i].p queue:queue eventHandler:never error:&error];
        CHECK(t == nil, "%s: no task", cases[i].what);
        CHECK([error.domain isEqualToString:MLXRTErrorDomain] && error.code == cases[i].code, "%s: %s %ld (%s)",
              cases[i].what, error.domain.UTF8String, (long)error.code, error.localizedDescription.UTF8String);
    }
    CHECK([engine submitRequestWithParameters:cases[0].p queue:queue eventHandler:never error:NULL] == nil,
          "error:NULL is allowed");
    // Give any stray event time to arrive: there must be none.
    dispatch_semaphore_t s = dispatch_semaphore_create(0);
    dispatch_semaphore_wait(s, dispatch_time(DISPATCH_TIME_NOW, 200 * NSEC_PER_MSEC));
    dispatch_release(s);
    CHECK(called == 0, "a failed submit calls nothing");
}

/// responseFormat, merged with optionsJSON: the output matches the regex and
/// ends the stream (STOP) despite ignore_eos.
static void test_response_format(MLXRTEngine *engine, dispatch_queue_t queue) {
    MLXRTRequestParameters *p = chat(@"Give a phone number.", 16);
    p.optionsJSON = @"{\"ignore_eos\": true}";
    p.responseFormat = @"{\"type\": \"regex\", \"pattern\": \"[0-9]{3}-[0-9]{4}\"}";
    Recorder *r = [[Recorder alloc] init];
    [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
    CHECK([r wait], "ends");
    CHECK(r->last.finishReason == MLXRTFinishReasonStop, "finish %ld", (long)r->last.finishReason);
    CHECK(r->text.length == 8 && [r->text characterAtIndex:3] == '-', "text %s", r->text.UTF8String);
    MRC_RELEASE(r);
}

static void test_concurrent(MLXRTEngine *engine, dispatch_queue_t queue) {
    enum { N = 3 };
    Recorder *rs[N];
    NSString *qs[N] = {@"Name a color.", @"What is 2+2?", @"Say hello."};
    for (int i = 0; i < N; i++) {
        rs[i] = [[Recorder alloc] init];
        [engine submitRequestWithParameters:chat(qs[i], 16) queue:queue eventHandler:[rs[i] handler] error:NULL];
    }
    for (int i = 0; i < N; i++) {
        CHECK([rs[i] wait] && rs[i]->last.kind == MLXRTEventKindDone && !rs[i]->mixedIDs && rs[i]->textEvents > 0,
              "concurrent request %d", i);
        MRC_RELEASE(rs[i]);
    }
}

/// Waits (up to 5 s) until the engine's counters show `completed` requests
/// and nothing queued, active or in flight: stats lag the events by a moment.
static MLXRTEngineStats *settled_stats(MLXRTEngine *engine, uint64_t completed) {
    MLXRTEngineStats *s = engine.stats;
    for (int i = 0; i < 500 && (s.completed < completed || s.inFlight || s.queued || s.active); i++) {
        usleep(10000);
        s = engine.stats;
    }
    return s;
}

static void test_info_and_stats(MLXRTEngine *engine, dispatch_queue_t queue) {
    MLXRTEngineInfo *info = engine.info;
    CHECK([info.architecture isEqualToString:@"llama"] && [info.modelFormat isEqualToString:@"gguf"],
          "architecture %s, format %s", info.architecture.UTF8String, info.modelFormat.UTF8String);
    CHECK(info.device.length > 0 && info.mlxVersion.length > 0, "device, MLX version");
    CHECK(info.vocabSize > 1000 && info.numLayers > 0 && info.hiddenSize > 0 && info.contextLength > 0 &&
              info.parameterBytes > 0,
          "sizes: vocab %u layers %u hidden %u context %llu", info.vocabSize, info.numLayers, info.hiddenSize,
          (unsigned long long)info.contextLength);
    CHECK(info.eosTokenIDs.count >= 1 && info.specialTokenIDs.count >= info.eosTokenIDs.count, "eos/special ids");
    CHECK(info.hasChatTemplate && (info.modalities & MLXRT_MODALITY_TEXT), "chat template, text input");
    CHECK(engine.info == info, "info is read once");

    // Stats count the requests the earlier tests ran (9 of them end).
    MLXRTEngineStats *s = settled_stats(engine, 9);
    CHECK(s.completed >= 9 && s.inFlight == 0 && s.queued == 0 && s.active == 0,
          "completed %llu, in flight %llu, queued %llu, active %llu", (unsigned long long)s.completed,
          (unsigned long long)s.inFlight, (unsigned long long)s.queued, (unsigned long long)s.active);
    CHECK(s.peakMemory >= s.activeMemory && s.peakMemory > 0, "memory counters");
    Recorder *r = [[Recorder alloc] init];
    [engine submitRequestWithParameters:chat(@"Hi", 2) queue:queue eventHandler:[r handler] error:NULL];
    CHECK([r wait], "one more request");
    MLXRTEngineStats *after = settled_stats(engine, s.completed + 1);
    CHECK(after.completed == s.completed + 1, "completed %llu -> %llu", (unsigned long long)s.completed,
          (unsigned long long)after.completed);
    MRC_RELEASE(r);
}

static void test_tokenizer(MLXRTEngine *engine, dispatch_queue_t queue) {
    NSError *error = nil;
    NSArray<NSNumber *> *ids = [engine tokenize:@"Hello world" parseSpecial:NO error:&error];
    CHECK(ids.count >= 2 && error == nil, "tokenize: %s", error.localizedDescription.UTF8String);
    CHECK([[engine detokenize:ids skipSpecial:NO error:NULL] isEqualToString:@"Hello world"], "round trip");
    NSArray<NSNumber *> *special = [engine tokenize:@"<|im_start|>" parseSpecial:YES error:NULL];
    CHECK(special.count == 1 && [engine.info.specialTokenIDs containsObject:[special objectAtIndex:0]], "a special token");
    CHECK([engine tokenize:@"<|im_start|>" parseSpecial:NO error:NULL].count > 1, "special text kept as text");
    NSArray<NSNumber *> *both = [special arrayByAddingObjectsFromArray:ids];
    CHECK([[engine detokenize:both skipSpecial:YES error:NULL] isEqualToString:@"Hello world"], "skipSpecial");
    CHECK([[engine detokenize:both skipSpecial:NO error:NULL] isEqualToString:@"<|im_start|>Hello world"],
          "special text: %s", [engine detokenize:both skipSpecial:NO error:NULL].UTF8String);
    CHECK([[engine detokenize:@[] skipSpecial:NO error:NULL] isEqualToString:@""], "no ids, no text");

    // The rendered chat is what a request with these messages processes.
    MLXRTRequestParameters *p = chat(@"Hi!", 4);
    MLXRTRenderedChat *rendered = [engine renderChatWithParameters:p error:&error];
    CHECK(rendered != nil, "renderChat: %s", error.localizedDescription.UTF8String);
    CHECK([rendered.text rangeOfString:@"Hi!"].location != NSNotFound && rendered.tokenIDs.count > 3, "rendered: %s",
          rendered.text.UTF8String);
    CHECK([[engine detokenize:rendered.tokenIDs skipSpecial:NO error:NULL] isEqualToString:rendered.text],
          "rendered ids are the rendered text");
    Recorder *r = [[Recorder alloc] init];
    [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
    CHECK([r wait] && r->last.usage.promptTokens == rendered.tokenIDs.count, "prompt tokens %lu vs %lu",
          (unsigned long)r->last.usage.promptTokens, (unsigned long)rendered.tokenIDs.count);
    MRC_RELEASE(r);

    error = nil;
    p.optionsJSON = @"{";
    CHECK([engine renderChatWithParameters:p error:&error] == nil && error.code == MLXRTErrorInvalidJSON,
          "bad options: %ld", (long)error.code);
    error = nil;
    CHECK([engine renderChatWithParameters:no_input() error:&error] == nil && error.code == MLXRTErrorInvalidArgument,
          "no messages: %ld", (long)error.code);
    CHECK([engine tokenize:@"x" parseSpecial:NO error:NULL] != nil, "error:NULL is allowed");
}

static void test_logprobs(MLXRTEngine *engine, dispatch_queue_t queue) {
    MLXRTRequestParameters *p = chat(@"What is the capital of France?", 12);
    CHECK(!p.logprobs && p.topLogprobs == 0, "off by default");
    Recorder *plain = [[Recorder alloc] init];
    [engine submitRequestWithParameters:p queue:queue eventHandler:[plain handler] error:NULL];
    CHECK([plain wait], "plain request");
    p.logprobs = YES;
    p.topLogprobs = 3;
    MLXRTRequestParameters *copy = [p copy];
    CHECK(copy.logprobs && copy.topLogprobs == 3, "copied");
    MRC_RELEASE(copy);
    Recorder *r = [[Recorder alloc] init];
    [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
    CHECK([r wait] && r->last.kind == MLXRTEventKindDone, "logprobs request");
    CHECK([r->text isEqualToString:plain->text], "same greedy text: '%s' vs '%s'", r->text.UTF8String,
          plain->text.UTF8String);
    for (MLXRTEvent *ev in plain->textEventList) CHECK(ev.logprobs.count == 0, "none unless asked");
    NSUInteger entries = 0;
    for (MLXRTEvent *ev in r->textEventList) {
        CHECK(ev.logprobs.count == ev.tokenIDs.count, "one entry per token: %lu vs %lu",
              (unsigned long)ev.logprobs.count, (unsigned long)ev.tokenIDs.count);
        for (NSUInteger i = 0; i < ev.logprobs.count && i < ev.tokenIDs.count; i++) {
            MLXRTTokenLogprob *lp = [ev.logprobs objectAtIndex:i];
            NSArray<MLXRTTokenLogprob *> *top = lp.topAlternatives;
            entries++;
            CHECK(lp.tokenID == [[ev.tokenIDs objectAtIndex:i] unsignedIntValue] && lp.logprob <= 0, "token %u logprob %f",
                  lp.tokenID, lp.logprob);
            CHECK(top.count == 3, "%lu alternatives", (unsigned long)top.count);
            if (top.count < 3) continue;
            MLXRTTokenLogprob *a = [top objectAtIndex:0], *b = [top objectAtIndex:1], *c = [top objectAtIndex:2];
            CHECK(a.logprob >= b.logprob && b.logprob >= c.logprob && a.topAlternatives.count == 0, "most likely first");
            // Greedy picks the most likely token.
            CHECK(a.tokenID == lp.tokenID && a.logprob == lp.logprob, "greedy: %u vs %u", lp.tokenID, a.tokenID);
        }
    }
    CHECK(entries == r->tokenCount && entries > 0, "%lu entries", (unsigned long)entries);
    MRC_RELEASE(plain);
    MRC_RELEASE(r);
}

/// The token ids of one request (nil if it did not end with done).
static NSArray<NSNumber *> *tokens_of(MLXRTEngine *engine, dispatch_queue_t queue, MLXRTRequestParameters *p,
                                      NSError **error) {
    Recorder *r = [[Recorder alloc] init];
    NSMutableArray<NSNumber *> *ids = nil;
    if ([engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:error] && [r wait] &&
        r->last.kind == MLXRTEventKindDone) {
        ids = [NSMutableArray array];
        for (MLXRTEvent *ev in r->textEventList) [ids addObjectsFromArray:ev.tokenIDs];
    }
    MRC_RELEASE(r);
    return ids;
}

static MLXRTRequestParameters *image_chat(NSArray<MLXRTImage *> *images) {
    MLXRTMessage *m = [MLXRTMessage userMessage:@"What is in this picture?" images:images];
    MLXRTRequestParameters *p = [MLXRTRequestParameters parametersWithMessages:@[ m ]];
    p.maxTokens = 8;
    p.optionsJSON = @"{\"ignore_eos\": true}";
    return p;
}

/// Images on the tiny vision-language checkpoint of tests/media.rs: the PNG
/// as NSData and its pixels as padded BGRA (wrapped without copying) and
/// packed RGBA give mlx-vlm's tokens; the tower runs once (stats); bad
/// buffers and a model without a tower fail the submit.
static void test_images(MLXRTEngine *text_engine, dispatch_queue_t queue, const char *folder, const char *png_path,
                        const char *rgb_path, NSUInteger w, NSUInteger h, const char *want_csv) {
    MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:@(folder)];
    NSError *error = nil;
    MLXRTEngine *engine = [[MLXRTEngine alloc] initWithConfiguration:cfg error:&error];
    MRC_RELEASE(cfg);
    CHECK(engine != nil, "vision engine: %s", error.localizedDescription.UTF8String);
    if (!engine) return;
    CHECK((engine.info.modalities & MLXRT_MODALITY_IMAGE) && !(text_engine.info.modalities & MLXRT_MODALITY_IMAGE),
          "modalities %u / %u", engine.info.modalities, text_engine.info.modalities);
    NSMutableArray<NSNumber *> *want = [NSMutableArray array];
    for (NSString *t in [@(want_csv) componentsSeparatedByString:@","]) [want addObject:@(t.longLongValue)];

    NSData *png = [NSData dataWithContentsOfFile:@(png_path)];
    NSData *rgb = [NSData dataWithContentsOfFile:@(rgb_path)];
    CHECK(png.length > 0 && rgb.length == w * h * 3, "inputs");
    NSArray<NSNumber *> *got = tokens_of(engine, queue, image_chat(@[ [MLXRTImage imageWithData:png] ]), &error);
    CHECK([got isEqualToArray:want], "encoded: %s vs mlx-vlm %s (%s)", got.description.UTF8String, want_csv,
          error.localizedDescription.UTF8String);

    NSUInteger stride = w * 4 + 12;
    uint8_t *bgra = calloc(stride * h, 1), *rgba = calloc(w * h * 4, 1);
    const uint8_t *px = rgb.bytes;
    for (NSUInteger y = 0; y < h; y++)
        for (NSUInteger x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                bgra[y * stride + x * 4 + c] = px[(y * w + x) * 3 + 2 - c];
                rgba[(y * w + x) * 4 + c] = px[(y * w + x) * 3 + c];
            }
    NSData *bgra_data = [NSData dataWithBytesNoCopy:bgra length:stride * h freeWhenDone:NO];
    MLXRTImage *bgra_image = [MLXRTImage imageWithPixels:bgra_data
                                                   width:w
                                                  height:h
                                             bytesPerRow:stride
                                                  format:MLXRTPixelFormatBGRA8];
    CHECK(bgra_image.pixelFormat == MLXRTPixelFormatBGRA8 && bgra_image.width == w && bgra_image.bytesPerRow == stride,
          "image properties");
    got = tokens_of(engine, queue, image_chat(@[ bgra_image ]), &error);
    CHECK([got isEqualToArray:want], "BGRA: %s (%s)", got.description.UTF8String, error.localizedDescription.UTF8String);
    MLXRTImage *rgba_image = [MLXRTImage imageWithPixels:[NSData dataWithBytes:rgba length:w * h * 4]
                                                   width:w
                                                  height:h
                                             bytesPerRow:0
                                                  format:MLXRTPixelFormatRGBA8];
    got = tokens_of(engine, queue, image_chat(@[ rgba_image ]), &error);
    CHECK([got isEqualToArray:want], "RGBA: %s (%s)", got.description.UTF8String, error.localizedDescription.UTF8String);
    MLXRTEngineStats *s = settled_stats(engine, 3);
    CHECK(s.towerRuns == 1 && s.encoderCacheHits == 2 && s.encoderCacheEntries == 1 && s.encoderCacheBytes > 0,
          "tower runs %llu, encoder cache hits %llu, entries %llu", (unsigned long long)s.towerRuns,
          (unsigned long long)s.encoderCacheHits, (unsigned long long)s.encoderCacheEntries);

    // Errors at submit: a buffer shorter than its rows, undecodable bytes, a
    // model without a vision tower; the engine keeps serving.
    MLXRTImage *short_image = [MLXRTImage imageWithPixels:[NSData dataWithBytes:bgra length:16]
                                                    width:w
                                                   height:h
                                              bytesPerRow:stride
                                                   format:MLXRTPixelFormatBGRA8];
    error = nil;
    CHECK(tokens_of(engine, queue, image_chat(@[ short_image ]), &error) == nil &&
              error.code == MLXRTErrorInvalidArgument && [error.localizedDescription rangeOfString:@"media[0]"].location != NSNotFound,
          "short buffer: %s", error.localizedDescription.UTF8String);
    error = nil;
    NSData *half = [png subdataWithRange:NSMakeRange(0, png.length / 2)];
    CHECK(tokens_of(engine, queue, image_chat(@[ [MLXRTImage imageWithData:half] ]), &error) == nil &&
              error.code == MLXRTErrorInvalidArgument,
          "truncated PNG: %s", error.localizedDescription.UTF8String);
    error = nil;
    CHECK(tokens_of(text_engine, queue, image_chat(@[ bgra_image ]), &error) == nil &&
              error.code == MLXRTErrorUnsupported && [error.localizedDescription rangeOfString:@"vision tower"].location != NSNotFound,
          "text-only model: %s", error.localizedDescription.UTF8String);
    got = tokens_of(engine, queue, image_chat(@[ bgra_image ]), &error);
    CHECK([got isEqualToArray:want], "after errors: %s", got.description.UTF8String);
    free(bgra);
    free(rgba);
    MRC_RELEASE(engine);
}

static MLXRTRequestParameters *audio_chat(NSArray<MLXRTAudio *> *audio) {
    MLXRTMessage *m = [MLXRTMessage userMessage:@"What is this sound?" images:@[] audio:audio];
    MLXRTRequestParameters *p = [MLXRTRequestParameters parametersWithMessages:@[ m ]];
    p.maxTokens = 8;
    p.optionsJSON = @"{\"ignore_eos\": true}";
    return p;
}

/// Audio on the tiny Gemma 4 checkpoint of tests/media_gemma4.rs: the WAV
/// as NSData and its samples as floats give mlx-vlm's tokens with one tower
/// run; samples at another rate and a model without an audio tower fail the
/// submit.
static void test_audio(MLXRTEngine *vision_only, dispatch_queue_t queue, const char *folder, const char *wav_path,
                       const char *f32_path, const char *want_csv) {
    MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:@(folder)];
    NSError *error = nil;
    MLXRTEngine *engine = [[MLXRTEngine alloc] initWithConfiguration:cfg error:&error];
    MRC_RELEASE(cfg);
    CHECK(engine != nil, "audio engine: %s", error.localizedDescription.UTF8String);
    if (!engine) return;
    CHECK((engine.info.modalities & MLXRT_MODALITY_AUDIO) != 0, "modalities %u", engine.info.modalities);
    NSMutableArray<NSNumber *> *want = [NSMutableArray array];
    for (NSString *t in [@(want_csv) componentsSeparatedByString:@","]) [want addObject:@(t.longLongValue)];
    NSData *wav = [NSData dataWithContentsOfFile:@(wav_path)];
    NSData *samples = [NSData dataWithContentsOfFile:@(f32_path)];
    CHECK(wav.length > 44 && samples.length > 0 && samples.length % 4 == 0, "audio inputs");
    NSArray<NSNumber *> *got = tokens_of(engine, queue, audio_chat(@[ [MLXRTAudio audioWithData:wav] ]), &error);
    CHECK([got isEqualToArray:want], "WAV: %s vs mlx-vlm %s (%s)", got.description.UTF8String, want_csv,
          error.localizedDescription.UTF8String);
    MLXRTAudio *floats = [MLXRTAudio audioWithSamples:samples sampleRate:16000];
    CHECK(floats.sampleRate == 16000, "audio properties");
    got = tokens_of(engine, queue, audio_chat(@[ floats ]), &error);
    CHECK([got isEqualToArray:want], "samples: %s (%s)", got.description.UTF8String, error.localizedDescription.UTF8String);
    MLXRTEngineStats *s = settled_stats(engine, 2);
    CHECK(s.towerRuns == 1 && s.encoderCacheHits == 1, "tower runs %llu, encoder cache hits %llu",
          (unsigned long long)s.towerRuns, (unsigned long long)s.encoderCacheHits);
    error = nil;
    CHECK(tokens_of(engine, queue, audio_chat(@[ [MLXRTAudio audioWithSamples:samples sampleRate:44100] ]), &error) == nil &&
              error.code == MLXRTErrorUnsupported && [error.localizedDescription rangeOfString:@"44100 Hz"].location != NSNotFound,
          "44.1 kHz: %s", error.localizedDescription.UTF8String);
    error = nil;
    CHECK(tokens_of(vision_only, queue, audio_chat(@[ floats ]), &error) == nil && error.code == MLXRTErrorUnsupported &&
              [error.localizedDescription rangeOfString:@"audio tower"].location != NSNotFound,
          "no audio tower: %s", error.localizedDescription.UTF8String);
    MRC_RELEASE(engine);
}

/// Releasing the engine with a request in flight ends it (CANCELLED); the
/// engine drafts with the model itself (draftModelPath), so the request
/// speculates by default.
static void test_engine_teardown(NSString *model, dispatch_queue_t queue) {
    MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:model];
    cfg.draftModelPath = model;
    MLXRTEngine *engine = [[MLXRTEngine alloc] initWithConfiguration:cfg error:NULL];
    MRC_RELEASE(cfg);
    CHECK(engine != nil, "second engine");
    MLXRTRequestParameters *p = chat(@"Tell me a long story.", 500);
    p.optionsJSON = @"{\"ignore_eos\": true}";
    Recorder *r = [[Recorder alloc] init];
    MLXRTRequestTask *task = [engine submitRequestWithParameters:p queue:queue eventHandler:[r handler] error:NULL];
#if !__has_feature(objc_arc)
    [task retain];  // the task outlives the engine
#endif
    dispatch_semaphore_wait(r->firstText, DISPATCH_TIME_FOREVER);
#if __has_feature(objc_arc)
    engine = nil;
#else
    [engine release];
#endif
    CHECK([r wait] && r->last.finishReason == MLXRTFinishReasonCancelled, "teardown cancels");
    [task cancel];  // harmless after the engine is gone
    MRC_RELEASE(task);
    MRC_RELEASE(r);
}

int main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr,
                "usage: %s MODEL_PATH VLM_FOLDER IMAGE.png IMAGE.rgb WIDTH HEIGHT TOKENS AUDIO_FOLDER CLIP.wav CLIP.f32 "
                "AUDIO_TOKENS\n",
                argv[0]);
        return 2;
    }
    @autoreleasepool {
        NSString *model = [NSString stringWithUTF8String:argv[1]];
        dispatch_queue_t queue = dispatch_queue_create("mlxrt.test", DISPATCH_QUEUE_SERIAL);
        dispatch_queue_set_specific(queue, &QUEUE_KEY, QUEUE_TAG, NULL);

        test_configuration();
        test_bad_model();
        MLXRTEngineConfiguration *cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:model];
        cfg.maxRows = 4;
        NSError *error = nil;
        MLXRTEngine *engine = [[MLXRTEngine alloc] initWithConfiguration:cfg error:&error];
        MRC_RELEASE(cfg);
        CHECK(engine != nil, "engine: %s", error.localizedDescription.UTF8String);
        if (engine) {
            test_streaming(engine, queue);
            test_stop_and_seed(engine, queue);
            test_cancel(engine, queue);
            test_submit_errors(engine, queue);
            test_response_format(engine, queue);
            test_concurrent(engine, queue);
            test_info_and_stats(engine, queue);
            test_tokenizer(engine, queue);
            test_logprobs(engine, queue);
            test_images(engine, queue, argv[2], argv[3], argv[4], (NSUInteger)atoi(argv[5]), (NSUInteger)atoi(argv[6]),
                        argv[7]);
            MRC_RELEASE(engine);
        }
        MLXRTEngineConfiguration *vision_cfg = [[MLXRTEngineConfiguration alloc] initWithModelPath:@(argv[2])];
        MLXRTEngine *vision = [[MLXRTEngine alloc] initWithConfiguration:vision_cfg error:&error];
        MRC_RELEASE(vision_cfg);
        CHECK(vision != nil, "vision engine: %s", error.localizedDescription.UTF8String);
        if (vision) {
            test_audio(vision, queue, argv[8], argv[9], argv[10], argv[11]);
            MRC_RELEASE(vision);
        }
        test_engine_teardown(model, queue);
        dispatch_release(queue);
    }
    if (failures) {
        fprintf(stderr, "%d Objective-C checks failed\n", failures);
        return 1;
    }
    fprintf(stderr, "all Objective-C checks passed\n");
    return 0;
}
